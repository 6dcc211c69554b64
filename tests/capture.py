"""CUDA-graph capture for the tests: a step captured once its kernels are compiled."""

import torch


def cuda_graph_of(step):
    """``step`` captured in a CUDA graph, after two calls on a side stream (the kernels compile outside the
    capture, and the allocator's pool is warm), as torch.cuda.graphs' documentation does."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph

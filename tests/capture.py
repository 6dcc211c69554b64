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


def decode_page_table(tokens, pages_per_request, page_size, num_pages, device, positions="cache_positions") -> dict:
    """FlashInfer's page table for a decode step (int32, as its planner gives it): request ``t`` owns
    ``pages_per_request`` scattered pages and appends token ``t`` at a position among them; request 1 is padding
    (-1). ``positions``: the name the call takes the positions under (FlashInfer's own ``positions``, or
    ``rope_and_cache``'s ``cache_positions``)."""
    table = {"kv_indices": torch.randperm(num_pages, device=device)[:tokens * pages_per_request],
             "kv_indptr": torch.arange(tokens + 1, device=device) * pages_per_request,
             "batch_indices": torch.arange(tokens, device=device),
             positions: torch.randint(0, pages_per_request * page_size, (tokens,), device=device)}
    table["batch_indices"][1] = -1
    return {name: t.to(torch.int32) for name, t in table.items()}

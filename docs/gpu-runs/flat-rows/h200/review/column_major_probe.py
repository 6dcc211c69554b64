import torch,ropekit,sys
from ropekit import reference as ref
from ropekit.positions import resolve_positions as rp
from ropekit.triton.launch import FlatConfig,TileConfig,rope_v4
T=34_100_000;HD=128;D="cuda"
bc=torch.zeros(HD//2,T,device=D);bs=torch.zeros(HD//2,T,device=D)
ct,st=ropekit.cos_sin_table(16,HD,device=D);p=5;bc[:,p]=ct[p];bs[:,p]=st[p]
q=torch.randn(1,1,2,HD,device=D);ids=torch.tensor([[p]],device=D)
cfg=FlatConfig(256,4) if sys.argv[1]=="flat" else TileConfig(1,2,4)
o=torch.full_like(q,float("nan"))
rope_v4(q,None,bc.t(),bs.t(),out_q=o,out_k=None,positions=rp(batch=1,seqlen=1,positions=ids),rotary_dim=HD,config=cfg)
torch.cuda.synchronize()
e=(o.double().cpu()-ref.rope(q.double().cpu(),ids.cpu())).abs()[0,0,0]
print(sys.argv[1],"max err",e.max().item(),"bad",torch.nonzero(e>1e-4).flatten().tolist())

import torch, ropekit
from ropekit import reference as ref
from ropekit.fused import qk_norm_rope
torch.manual_seed(0)
B,S,Hq,Hk,D,R=1,2,2,1,8,6
q=torch.randn(B,S,Hq,D,dtype=torch.float64,requires_grad=True); k=torch.randn(B,S,Hk,D,dtype=torch.float64,requires_grad=True)
qw=torch.randn(D,dtype=torch.float64,requires_grad=True); kw=torch.randn(D,dtype=torch.float64,requires_grad=True)
cos,sin=ropekit.cos_sin_table(16, R)
cos,sin=cos.double(),sin.double()
oq,ok=qk_norm_rope(q,k,cos,sin,qw,kw,positions=3,rotary_dim=R, weight_offset=1.0)
pos=ref.token_positions(B,S,offsets=3)
c,s=cos[pos][:,:,None,:], sin[pos][:,:,None,:]
def refn(x,w): 
    x=x*torch.rsqrt(x.pow(2).mean(-1,keepdim=True)+1e-6)*(1+w)
    return torch.cat((ref.rotate_pairs(x[...,:R],c,s),x[...,R:]),-1)
rq,rk=refn(q,qw),refn(k,kw)
print((oq-rq).abs().max(),(ok-rk).abs().max())
gq,gk=torch.randn_like(oq),torch.randn_like(ok)
g1=torch.autograd.grad((oq*gq).sum()+(ok*gk).sum(),(q,k,qw,kw))
g2=torch.autograd.grad((rq*gq).sum()+(rk*gk).sum(),(q,k,qw,kw))
for a,b in zip(g1,g2): print((a-b).abs().max())
print(g1[0]); print(g2[0])

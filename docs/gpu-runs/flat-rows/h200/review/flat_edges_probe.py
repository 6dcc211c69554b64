import itertools,sys,torch,ropekit
from ropekit import reference as ref
from ropekit.positions import resolve_positions as rp
from ropekit.triton.launch import FlatConfig,rope_v4
D="cuda";G=64;torch.manual_seed(0);small=sys.argv[1]=="s"
def buf(s,dt):
    n=1
    for x in s:n*=x
    b=torch.full((n+2*G,),7777.,dtype=dt,device=D);o=b[G:G+n].view(s);o.fill_(float("nan"));return b,o
F=0;R=0;T=12
hds=[24,96] if small else [2,6,24,80,96,256,512]
for hd,bl,pr,(hq,hk),kd,dt in itertools.product(hds,[64,1024],[0,1],[(3,0),(4,1),(3,3)],["ids","far"],[torch.float32]):
    B,S=2,3;i=torch.randint(0,T,(B,S))
    if kd=="far":i[0,0]=T;i[1,2]=T+5;i[0,1]=-1
    c,s=ropekit.cos_sin_table(T,hd,device=D);q=torch.randn(B,S,hq,hd,device=D).to(dt);k=torch.randn(B,S,hk,hd,device=D).to(dt) if hk else None
    bq,oq=buf(q.shape,dt);bk,ok=buf(k.shape,dt) if hk else (None,None);cj=bool(R%2)
    rope_v4(q,k,c,s,out_q=oq,out_k=ok,positions=rp(batch=B,seqlen=S,positions=i.to(D)),rotary_dim=hd,conjugate=cj,config=FlatConfig(bl,4,paired=bool(pr)));R+=1
    for x,o,b in((q,oq,bq),(k,ok,bk)):
        if x is None:continue
        e=ref.rope(x.double().cpu(),i.clamp(0,T-1),conjugate=cj);e[(i<0)|(i>=T)]=float("nan")
        tol=2e-2 if dt==torch.bfloat16 else 1e-5
        g=(b[:G]==7777).all() and (b[-G:]==7777).all()
        if not torch.allclose(o.double().cpu(),e,atol=tol,rtol=tol,equal_nan=True) or not g:F+=1;print("FAIL",hd,bl,pr,hq,hk,kd,dt,g)
torch.cuda.synchronize();print("runs",R,"fails",F)

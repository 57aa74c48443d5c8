"""Forms of the switch cost tried on a calibration's random-switch episodes, held out in turn.

python explore_forms.py CAL.json KIND [KIND ...]

KIND: pair1 (per pair of families, the switching decision), into1 (per family entered, the
switching decision), pooled2 (one cost for the switching decision, one for the next), into2
(per family entered, the switching decision and the next one if it stays), into3 (three
decisions), pair2 (per pair, two decisions), any2 (per family entered, the next decision
charged whatever it plays). Each fitted by coordinate search on a grid (0.05 steps), the
held-out episode replayed open loop from its reset loss; prints the leave-one-out median and
mean of the mean absolute log-loss error, per episode, and the fit on all episodes.
"""
import json, numpy as np, itertools, sys
from commgym.env.sim.progress import ProgressModel, switch_family
c=json.load(open(sys.argv[1]))
curves={e: v['curves'] for e,v in c['entries'].items()}
floor=c['target_loss']
base=ProgressModel(curves,0.0,floor)
eps=[(e,l) for e,l in c['switch_episodes']]
GRID=np.linspace(0,1.9,39)
def replay_any(params, entries, losses, sq=False):
    loss=float(losses[0]); prev=None; pending=0.0; err=[]
    for i,e in enumerate(entries):
        p = pending
        pending = 0.0
        if prev is not None and e!=prev:
            p += params.get((switch_family(e),0),0.0); pending = params.get((switch_family(e),1),0.0)
        loss=base.loss_at(e, base.position(e, loss)+1.0-p)
        prev=e
        if losses[i+1] < base.floor_loss: break
        err.append(abs(np.log(loss)-np.log(max(losses[i+1],1e-8))))
    return float(np.sum(np.square(err))) if sq else float(np.mean(err))
def replay(pen, entries, losses, sq=False):
    # pen(prev_entry, entry, since) -> lost progress for this decision; since = decisions since the switch (0 = switching decision)
    loss=float(losses[0]); prev=None; since=99; last_switch=None; err=[]
    for i,e in enumerate(entries):
        if prev is not None and e!=prev:
            since=0; last_switch=(prev,e)
        elif prev is not None:
            since+=1
        p = pen(last_switch, since) if last_switch else 0.0
        loss=base.loss_at(e, base.position(e, loss)+1.0-p)
        prev=e
        if losses[i+1] < base.floor_loss: break
        err.append(abs(np.log(loss)-np.log(max(losses[i+1],1e-8))))
    return float(np.sum(np.square(err))) if sq else float(np.mean(err))
def make(kind, params):
    def pen(sw, since):
        a,b=sw
        if kind=="pair1":
            k=f"{switch_family(a)}->{switch_family(b)}"; return params.get(k,0.0) if since==0 else 0.0
        if kind=="into1":
            return params.get(switch_family(b),0.0) if since==0 else 0.0
        if kind=="into2":
            return params.get((switch_family(b),since),0.0) if since<=1 else 0.0
        if kind=="into3":
            return params.get((switch_family(b),since),0.0) if since<=2 else 0.0
        if kind=="pair2":
            k=f"{switch_family(a)}->{switch_family(b)}"; return params.get((k,since),0.0) if since<=1 else 0.0
        if kind=="pooled2":
            return params.get(since,0.0) if since<=1 else 0.0
    return pen
def keys(kind, train):
    ks=set()
    for entries,_ in train:
        prev=None
        for e in entries:
            if prev and e!=prev:
                a,b=prev,e
                if kind=="pair1": ks.add(f"{switch_family(a)}->{switch_family(b)}")
                if kind=="into1": ks.add(switch_family(b))
                if kind=="into2": ks|={(switch_family(b),0),(switch_family(b),1)}
                if kind=="into3": ks|={(switch_family(b),0),(switch_family(b),1),(switch_family(b),2)}
                if kind=="pair2": ks|={(f"{switch_family(a)}->{switch_family(b)}",0),(f"{switch_family(a)}->{switch_family(b)}",1)}
                if kind=="pooled2": ks|={0,1}
            prev=e
    return sorted(ks, key=str)
def fit(kind, train):
    ks=keys("into2" if kind=="any2" else kind,train); params={k:0.3 for k in ks}
    if kind=="any2":
        cost=lambda p: sum(replay_any(p,e,l,True) for e,l in train)
    else:
        cost=lambda p: sum(replay(make(kind,p),e,l,True) for e,l in train)
    for _ in range(3):
        for k in ks:
            best=min(GRID, key=lambda v: cost({**params,k:v})); params[k]=float(best)
    return params
for kind in sys.argv[2:]:
    errs=[]
    for j in range(len(eps)):
        tr=[x for i,x in enumerate(eps) if i!=j]
        p=fit(kind,tr)
        errs.append(replay_any(p,*eps[j]) if kind=="any2" else replay(make(kind,p),*eps[j]))
    full=fit(kind,eps)
    print(kind, "LOO open median %.4f mean %.4f" % (np.median(errs), np.mean(errs)), [round(x,3) for x in errs], {str(k):round(v,2) for k,v in full.items()}, flush=True)

import re, sys, collections
def secs(t):
    d = 0
    if "-" in t: d, t = t.split("-"); d = int(d)
    parts = [int(x) for x in t.split(":")]
    while len(parts) < 3: parts.insert(0, 0)
    return d*86400 + parts[0]*3600 + parts[1]*60 + parts[2]
procs = {}
for line in open(sys.argv[1]):
    if line.startswith("T "): continue
    f = line.split(None, 4)
    if len(f) < 5: continue
    pid, ppid, et, tm, args = f
    try: c = secs(tm); et = int(et)
    except ValueError: continue
    p = procs.setdefault(pid, {"args": args.strip(), "cpu": 0, "et": 0, "ppid": ppid})
    p["cpu"] = max(p["cpu"], c); p["et"] = max(p["et"], et)
tot = sum(p["cpu"] for p in procs.values())
print("total cpu seen", tot)
long = sorted(procs.items(), key=lambda kv: -kv[1]["cpu"])
for pid, p in long[:30]:
    print(f'{p["cpu"]:5d}s cpu {p["et"]:5d}s alive pid {pid} ppid {p["ppid"]} {p["args"][:140]}')

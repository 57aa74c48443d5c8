import sys, collections, xml.etree.ElementTree as ET
t = ET.parse(sys.argv[1]).getroot()
per_file = collections.Counter(); n = collections.Counter(); tests = []
for tc in t.iter("testcase"):
    f = tc.get("classname"); tm = float(tc.get("time", 0))
    mod = f.rsplit(".", 1)[0] if f.count(".") > 2 and f.split(".")[-1][0].isupper() else f
    per_file[mod] += tm; n[mod] += 1; tests.append((tm, f + "::" + tc.get("name")))
tot = sum(per_file.values())
print(f"total {tot:.0f} s over {sum(n.values())} tests")
for m, s in per_file.most_common(45): print(f"{s:7.1f} {n[m]:4d} {m}")
print("--- slowest tests")
for tm, name in sorted(tests, reverse=True)[:60]: print(f"{tm:6.1f} {name}")
import numpy as np
a = np.array(sorted([x for x,_ in tests]))
for thr in (1,2,5,10,20): print(f">= {thr}s: {np.sum(a>=thr)} tests, {a[a>=thr].sum():.0f} s")

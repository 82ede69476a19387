#!/usr/bin/env python3
# python3 benches/server_greedy_repeat.py http://127.0.0.1:PORT  (a fucina server on any model)
# session 34: the server on the GPU backend answers several requests in a row (a sampler, and so
# a pooled id readback, per request): greedy completions must repeat exactly.
import json, sys, time, urllib.request
url = sys.argv[1]
for _ in range(120):
    try:
        urllib.request.urlopen(url + "/v1/models", timeout=2).read(); break
    except Exception:
        time.sleep(1)
def post(body):
    r = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                               headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=120).read())
outs = []
for i in range(4):
    t = time.time()
    r = post({"prompt": "hello world", "max_tokens": 32, "temperature": 0})
    outs.append(r["choices"][0]["text"])
    print(f"greedy {i}: {time.time()-t:.3f}s {r['usage']} {outs[-1]!r}")
r = post({"prompt": "hello world", "max_tokens": 32, "temperature": 0.8, "seed": 7})
print("sampled:", r["usage"], repr(r["choices"][0]["text"]))
print("greedy identical:", len(set(outs)) == 1)
sys.exit(0 if len(set(outs)) == 1 else 1)

#!/usr/bin/env python3
"""Decode throughput of `cohort serve` with N concurrent streams against the same N requests
served one at a time, in one run (docs/serving.md). Starts `cohort serve CKPT` on a free port,
sends the requests, stops it. Prints tokens/s of each mode and their ratio.

  tools/bench_serve.py CKPT [--streams 16] [--max-tokens 64] [--cohort build/cohort]
"""
import argparse, json, re, subprocess, sys, threading, time, urllib.request

def post(port, body):
    req = urllib.request.Request('http://127.0.0.1:%d/v1/completions' % port,
                                 data=json.dumps(body).encode(), method='POST')
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('checkpoint')
    ap.add_argument('--streams', type=int, default=16)
    ap.add_argument('--max-tokens', type=int, default=64)
    ap.add_argument('--cohort', default='build/cohort')
    a = ap.parse_args()
    srv = subprocess.Popen([a.cohort, 'serve', a.checkpoint, '--bind', '127.0.0.1:0'],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline()
        m = re.search(r':(\d+)/v1', line)
        if not m:
            sys.exit('bench_serve: the server did not start: ' + line)
        port = int(m.group(1))
        prompts = ['And God said', 'In the beginning', 'And the LORD', 'Blessed are the',
                   'Thou shalt not', 'And it came to pass', 'The LORD is my', 'Let there be']
        bodies = [{'prompt': prompts[i % len(prompts)], 'max_tokens': a.max_tokens,
                   'temperature': 1.0, 'seed': i} for i in range(a.streams)]
        post(port, dict(bodies[0], max_tokens=4))  # warm-up
        t = time.monotonic(); seq = [post(port, b) for b in bodies]; t_seq = time.monotonic() - t
        out = [None] * a.streams
        def one(i): out[i] = post(port, bodies[i])
        th = [threading.Thread(target=one, args=(i,)) for i in range(a.streams)]
        t = time.monotonic()
        for x in th: x.start()
        for x in th: x.join()
        t_con = time.monotonic() - t
        n_seq = sum(r['usage']['completion_tokens'] for r in seq)
        n_con = sum(r['usage']['completion_tokens'] for r in out)
        same = sum(seq[i]['choices'][0]['text'] == out[i]['choices'][0]['text'] for i in range(a.streams))
        cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
        print('bench serve: %s, %d requests of %d tokens, CPU %s' % (a.checkpoint, a.streams, a.max_tokens, cpu))
        print('  one at a time: %d tokens in %.2f s = %.0f tokens/s' % (n_seq, t_seq, n_seq / t_seq))
        print('  %d concurrent: %d tokens in %.2f s = %.0f tokens/s' % (a.streams, n_con, t_con, n_con / t_con))
        print('  ratio %.2fx; %d of %d texts equal between the modes (seeded sampling)' %
              ((n_con / t_con) / (n_seq / t_seq), same, a.streams))
    finally:
        srv.terminate(); srv.wait()

if __name__ == '__main__':
    main()

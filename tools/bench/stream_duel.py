#!/usr/bin/env python3
"""Helper of stream_duel.sh: runs one timed engine process (optionally inside a fresh memory
cgroup), measures what it read and its peak memory, and prints the final table.

  stream_duel.py run --out FILE.json [--limit 4G] [--evict F ...] [--timeout S] -- CMD ...
      Evicts the files named by --evict from the page cache (posix_fadvise DONTNEED: only our
      model files, never the whole machine's cache), then runs CMD. With --limit, CMD runs in a
      new memory cgroup of that limit (v1: memory.limit_in_bytes and, when present,
      memory.memsw.limit_in_bytes; v2: memory.max and memory.swap.max = 0), made under this
      process's own memory cgroup and removed afterwards. Writes FILE.json: exit status, wall
      seconds, stdout/stderr tails, read_bytes from /proc/PID/io and VmHWM from
      /proc/PID/status (both read after the process exited, before it was reaped), the
      rusage max RSS, and with --limit the cgroup's peak usage, failcnt and OOM kills.
  stream_duel.py table DIR
      Reads DIR/*.json (names ENGINE_SETTING_ROUND[_pp].json) and prints the Markdown table.
  stream_duel.py prompt N
      Prints N pseudo-random prompt ids (fixed seed) as the one-character text of
      waste_moe_to_gguf.py's vocabulary (for ramvamp, which takes text).
"""
import json
import os
import re
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_size(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)(?:i?B)?", s.strip(), re.I)
    if not m:
        sys.exit(f"size {s!r}: expected a number with K/M/G/T")
    return int(float(m.group(1)) * (1 << (10 * "BKMGT".index(m.group(2).upper() or "B"))))


def evict(paths):
    for p in paths:
        files = [p] if os.path.isfile(p) else [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Cgroup:
    """A fresh memory cgroup under this process's own."""

    def __init__(self, limit):
        own = open("/proc/self/cgroup").read().splitlines()
        v1 = [l.split(":", 2)[2] for l in own if l.split(":", 2)[1] == "memory"]
        name = f"stream-duel-{os.getpid()}"
        if v1 and os.path.isdir("/sys/fs/cgroup/memory"):
            self.v2 = False
            self.path = os.path.join("/sys/fs/cgroup/memory" + v1[0], name)
        else:
            rel = [l.split(":", 2)[2] for l in own if l.startswith("0::")][0]
            self.v2 = True
            self.path = os.path.join("/sys/fs/cgroup" + rel, name)
        os.mkdir(self.path)
        if self.v2:
            self.write("memory.max", limit)
            if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                self.write("memory.swap.max", 0)
        else:
            self.write("memory.limit_in_bytes", limit)
            if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                self.write("memory.memsw.limit_in_bytes", limit)

    def write(self, f, v):
        with open(os.path.join(self.path, f), "w") as fh:
            fh.write(str(v))

    def read(self, f):
        try:
            with open(os.path.join(self.path, f)) as fh:
                return fh.read()
        except OSError:
            return ""

    def tasks_file(self):
        return os.path.join(self.path, "cgroup.procs" if self.v2 else "tasks")

    def stats(self):
        if self.v2:
            ev = dict(l.split() for l in self.read("memory.events").splitlines() if l.strip())
            peak = self.read("memory.peak").strip()
            return {"cg_peak_bytes": int(peak) if peak else None, "cg_oom_kill": int(ev.get("oom_kill", 0)),
                    "cg_failcnt": int(ev.get("max", 0))}
        oc = dict(l.split() for l in self.read("memory.oom_control").splitlines() if l.strip())
        return {"cg_peak_bytes": int(self.read("memory.max_usage_in_bytes") or 0),
                "cg_failcnt": int(self.read("memory.failcnt") or 0), "cg_oom_kill": int(oc.get("oom_kill", 0))}

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def run(argv):
    if "--" not in argv:
        sys.exit(__doc__)
    opts, cmd = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    out, limit, timeout, ev = None, None, 3600.0, []
    k = 0
    while k < len(opts):
        if opts[k] == "--out":
            out = opts[k + 1]; k += 2
        elif opts[k] == "--limit":
            limit = parse_size(opts[k + 1]); k += 2
        elif opts[k] == "--timeout":
            timeout = float(opts[k + 1]); k += 2
        elif opts[k] == "--evict":
            ev.append(opts[k + 1]); k += 2
        else:
            sys.exit(f"unknown option {opts[k]}\n{__doc__}")
    evict(ev)
    cg = Cgroup(limit) if limit else None
    so, se = out + ".stdout", out + ".stderr"
    t0 = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            if cg:
                with open(cg.tasks_file(), "w") as f:
                    f.write(str(os.getpid()))
            fo, fe = os.open(so, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), os.open(se, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fo, 1); os.dup2(fe, 2)
            os.execvp(cmd[0], cmd)
        except BaseException as e:  # noqa: BLE001 - the child must never return into this script
            os.write(2, f"stream_duel: cannot start {cmd[0]}: {e}\n".encode())
            os._exit(127)
    timed_out = False
    while True:
        # wait without reaping, so /proc/PID still holds the exited process's io and status
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if info is not None and info.si_pid == pid:
            break
        if time.time() - t0 > timeout:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    wall = time.time() - t0
    rec = {"cmd": cmd, "limit": limit, "wall_s": wall, "timed_out": timed_out}
    try:
        io = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().splitlines())
        rec["read_bytes"] = int(io["read_bytes"])
    except (OSError, KeyError, ValueError):
        rec["read_bytes"] = None
    try:
        st = open(f"/proc/{pid}/status").read()
        m = re.search(r"VmHWM:\s+(\d+) kB", st)
        rec["vmhwm_bytes"] = int(m.group(1)) * 1024 if m else None
    except OSError:
        rec["vmhwm_bytes"] = None
    _, status, ru = os.wait4(pid, 0)
    rec["exit"] = os.waitstatus_to_exitcode(status)
    rec["ru_maxrss_bytes"] = ru.ru_maxrss * 1024
    if cg:
        rec.update(cg.stats())
        cg.remove()
    rec["stdout"] = open(so, errors="replace").read()[-20000:]
    rec["stderr"] = open(se, errors="replace").read()[-20000:]
    with open(out, "w") as f:
        json.dump(rec, f)


def size_bytes(text):
    """ramvamp's human_bytes: '1.23 GiB' -> bytes."""
    m = re.fullmatch(r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB)", text.strip())
    if not m:
        return None
    return float(m.group(1)) * (1 << (10 * ["B", "KiB", "MiB", "GiB", "TiB"].index(m.group(2))))


def figures(engine, rec, pp):
    """One run -> {decode, prefill, hit, read_per_tok, peak}; None where the engine gave none."""
    f = {"ok": rec["exit"] == 0 and not rec["timed_out"], "peak": rec.get("ru_maxrss_bytes"), "cg": rec.get("cg_peak_bytes")}
    f["oom"] = rec.get("cg_oom_kill")
    if not f["ok"]:
        return f
    if engine == "waste":
        d = json.loads(rec["stdout"])
        f.update(decode=d["decode_tok_s"], prefill=d["prefill_tok_s"], hit=d["decode_hit_rate"],
                 read_per_tok=d["decode_bytes_read_per_token"])
        busy, secs = d.get("decode_disk_busy_secs"), d.get("decode_secs")
        if busy and secs:
            # The disk bound measured in the run itself: the bytes over the disk's busy time is
            # the bandwidth it gave while it had work; the share of the decode it was busy is
            # how close decode came to that bound.
            f["busy_share"] = busy / secs
            f["busy_gbs"] = d["decode_bytes_read_per_token"] * d["decode_tokens"] / busy / 1e9
            f["in_flight"] = d["decode_read_secs"] / busy
        if d.get("prefill_bytes_read") is not None and d.get("prefill_secs"):
            # The prefill's own I/O (waste >= 1de4ea5): what it read, and how long it waited.
            f["pf_read"], f["pf_wait"], f["pf_secs"] = d["prefill_bytes_read"], d["prefill_io_wait_secs"], d["prefill_secs"]
    elif engine == "llama":
        rows = [json.loads(l) for l in rec["stdout"].splitlines() if l.startswith("{")]
        tg = [r for r in rows if r.get("n_gen", 0) > 0]
        pr = [r for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
        if tg:
            f["decode"] = tg[0]["avg_ts"]
            if rec["read_bytes"] is not None:
                f["read_per_tok"] = rec["read_bytes"] / tg[0]["n_gen"]
        if pr:
            f["prefill"] = pr[0]["avg_ts"]
    elif engine == "ramvamp":
        err = rec["stderr"]
        m = re.search(r"prefill: (\d+) tokens in ([\d.]+)s \(([\d.]+) tok/s\); decode: (\d+) tokens in ([\d.]+)s \(([\d.]+) tok/s\)", err)
        if m:
            f["prefill"], f["decode"] = float(m.group(3)), float(m.group(6))
            ntok = int(m.group(4))
            d = re.search(r"^\s*decode: (\d+) requests, (\d+) hits \(([\d.]+)%\).*?; (.+?) read in", err, re.M)
            if d:
                f["hit"] = float(d.group(3)) / 100
                b = size_bytes(d.group(4))
                if b is not None and ntok:
                    f["read_per_tok"] = b / ntok
    return f


def table(argv):
    out = argv[0]
    runs = {}
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"(waste|llama|ramvamp)_([^_]+)_(\d+)(_pp)?\.json", name)
        if not m:
            continue
        with open(os.path.join(out, name)) as fh:
            rec = json.load(fh)
        key = (m.group(1), m.group(2))
        runs.setdefault(key, {}).setdefault(int(m.group(3)), {})[("pp" if m.group(4) else "main")] = figures(m.group(1), rec, bool(m.group(4)))
    meta = json.load(open(os.path.join(out, "meta.json")))
    print(f"host: {meta['cpu']} ({meta['cpus']} CPUs), {meta['ram']}; waste {meta['commit']}; "
          f"model {meta['model']}; {meta['threads']} threads; prompt {meta['prompt']} tokens, "
          f"decode {meta['gen']} tokens; median of {meta['rounds']} rounds (the rounds in parentheses)")
    print(f"disk: {meta['disk']}")
    print()
    print("| engine | setting | decode tok/s | prefill tok/s | hit rate | read per token | peak RSS | cgroup peak | failures |")
    print("|---|---|---|---|---|---|---|---|---|")
    names = {"waste": "waste", "llama": "llama.cpp (mmap)", "ramvamp": "ramvamp"}
    order = ["ram"] + meta["limits"]

    def col(vals, fmt):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "—"
        med = statistics.median(vals)
        return f"**{fmt(med)}** ({', '.join(fmt(v) for v in vals)})" if len(vals) > 1 else fmt(med)

    for setting in order:
        for engine in ("waste", "llama", "ramvamp"):
            rs = runs.get((engine, setting))
            if not rs:
                continue
            main = [rs[r].get("main", {}) for r in sorted(rs)]
            pp = [rs[r].get("pp", rs[r].get("main", {})) for r in sorted(rs)]
            fails = [f"round {r}: {'OOM' if rs[r].get('main', {}).get('oom') else 'failed/timeout'}"
                     for r in sorted(rs) if not rs[r].get("main", {}).get("ok")]
            print(f"| {names[engine]} | {'in RAM' if setting == 'ram' else setting + ' cgroup'} | "
                  f"{col([x.get('decode') for x in main], lambda v: f'{v:.2f}')} | "
                  f"{col([x.get('prefill') for x in pp], lambda v: f'{v:.2f}')} | "
                  f"{col([x.get('hit') for x in main], lambda v: f'{100 * v:.1f} %')} | "
                  f"{col([x.get('read_per_tok') for x in main], lambda v: f'{v / 2**20:.1f} MiB')} | "
                  f"{col([x.get('peak') for x in main], lambda v: f'{v / 2**30:.2f} GiB')} | "
                  f"{col([x.get('cg') for x in main], lambda v: f'{v / 2**30:.2f} GiB')} | "
                  f"{'; '.join(fails) or '—'} |")
    busy = [(s, [rs.get("main", {}) for _, rs in sorted(runs.get(("waste", s), {}).items())],
             [rs.get("pp", rs.get("main", {})) for _, rs in sorted(runs.get(("waste", s), {}).items())]) for s in order]
    busy = [(s, m, pp) for s, m, pp in busy if any(x.get("busy_share") for x in m)]
    if busy:
        print()
        print("| waste | disk busy, share of decode | GB/s while busy | reads in flight while busy | prefill: read | prefill: I/O wait of its time |")
        print("|---|---|---|---|---|---|")
        for s, m, pp in busy:
            print(f"| {'in RAM' if s == 'ram' else s + ' cgroup'} | "
                  f"{col([x.get('busy_share') for x in m], lambda v: f'{100 * v:.0f} %')} | "
                  f"{col([x.get('busy_gbs') for x in m], lambda v: f'{v:.2f}')} | "
                  f"{col([x.get('in_flight') for x in m], lambda v: f'{v:.1f}')} | "
                  f"{col([x.get('pf_read') for x in pp], lambda v: f'{v / 2**30:.2f} GiB')} | "
                  f"{col([x['pf_wait'] / x['pf_secs'] if x.get('pf_secs') else None for x in pp], lambda v: f'{100 * v:.0f} %')} |")
        print()
        print("prefill: the prompt's expert bytes read and the share of the prefill spent waiting for them; a prefill")
        print("that reads much but waits little is computing, or faulting in the cache's fresh pages (docs/BENCHMARKS.md).")
    print()
    print("read per token: waste and ramvamp report the expert bytes their decode read; for llama.cpp it is the")
    print("process's read_bytes (/proc/PID/io: page-cache misses of its mmap, load included) over the decoded")
    print("tokens. peak RSS: the process's maximum resident set (getrusage, mapped file pages included);")
    print("cgroup peak: the cgroup's peak usage, page cache included (a buffered reader fills the limit with it).")


def prompt(argv):
    n = int(argv[0])
    sys.path.insert(0, HERE)
    import waste_moe_to_gguf as moe
    x, ids = 12345, []
    while len(ids) < n:
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        i = 256 + (x >> 33) % 150000
        ids.append(i)
    sys.stdout.write(moe.ids_to_text(ids))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    {"run": run, "table": table, "prompt": prompt}.get(sys.argv[1], lambda a: sys.exit(__doc__))(sys.argv[2:])

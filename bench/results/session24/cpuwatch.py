"""Run a command; sample its process tree's CPU time (utime+stime) every 0.5 s; write NAME.log and
NAME.cpu.json (last values and the series) and print each process's total. Usage: cpuwatch.py NAME CMD..."""
import subprocess, sys, time, os, json
proc = subprocess.Popen(sys.argv[2:], stdout=open(sys.argv[1] + ".log", "w"), stderr=subprocess.STDOUT)
seen = {}
series = []
tck = os.sysconf("SC_CLK_TCK")
def kids(root):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            st = open(f"/proc/{pid}/stat").read()
            ppid = int(st.rsplit(")", 1)[1].split()[1])
            out.append((int(pid), ppid, st))
        except OSError: pass
    tree = {root}; changed = True
    while changed:
        changed = False
        for pid, ppid, st in out:
            if ppid in tree and pid not in tree: tree.add(pid); changed = True
    return [(pid, st) for pid, ppid, st in out if pid in tree]
while proc.poll() is None:
    for pid, st in kids(proc.pid):
        f = st.rsplit(")", 1)[1].split()
        cpu = (int(f[11]) + int(f[12])) / tck
        try: cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:120]
        except OSError: cmd = "?"
        seen[pid] = (cpu, cmd, int(f[17]) if len(f)>17 else 0)
    series.append((time.time(), {pid: v[0] for pid, v in seen.items()}))
    time.sleep(0.5)
json.dump({"seen": seen, "series": series}, open(sys.argv[1] + ".cpu.json", "w"))
for pid, (cpu, cmd, _) in sorted(seen.items()): print(pid, round(cpu, 1), cmd)

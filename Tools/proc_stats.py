"""What /proc says of a process, for the serve benchmarks and the soak (serve-scale.py,
serve-soak.py, serve-hostile.py import it from beside them)."""
import os


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss_split(pid):
    """RssAnon (heap, stacks) and RssFile (code and data pages of the binary and libraries)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out.get("RssAnon", 0), out.get("RssFile", 0)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))

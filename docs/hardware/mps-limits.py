#!/usr/bin/env python3
"""What MPS limits a tenant gets on a real GPU, for Tessera's per-claim MPS daemons.

Run on a machine with an NVIDIA GPU and driver (no MIG changes, no compute-mode change:
the GPU's compute mode is read and left as found). It starts two MPS control daemons on
GPU 0, each with its own pipe, log and limits in its environment, as Tessera's plugin
starts one per claim:

  claim-a: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M
  claim-b: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M

and runs clients of claim-a: one with its environment as Tessera's CDI spec leaves it (no
limit variables), one that raises both variables, one that lowers the memory; and one
client of claim-b. Each client reports, through the CUDA driver API (libcuda.so.1 by
ctypes, no toolkit needed), the context's total memory (cuMemGetInfo), its SMs
(cuCtxGetExecAffinity) and whether a 6 GiB allocation succeeds. Then it quits both daemons.

Usage: mps-limits.py [report.md]   (default: stdout)
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

CLIENT = r'''
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        print(json.dumps({"error": what, "code": rc, "name": (name.value or b"").decode()}))
        sys.exit(0)
check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
free, total = ctypes.c_size_t(), ctypes.c_size_t()
check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
class Affinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]
aff = Affinity()
rc = cuda.cuCtxGetExecAffinity(ctypes.byref(aff), 0)
sms = aff.sm_count if rc == 0 else None
ptr = ctypes.c_uint64()
rc_alloc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(6 << 30))
if rc_alloc == 0:
    cuda.cuMemFree_v2(ptr)
print(json.dumps({"total_mib": total.value >> 20, "free_mib": free.value >> 20,
                  "sms": sms, "alloc_6gib": rc_alloc}))
'''


def run(cmd, env=None, stdin=None):
    return subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True, timeout=60)


def main():
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
    smi = run(["nvidia-smi", "--query-gpu=name,uuid,compute_mode,mig.mode.current,driver_version",
               "--format=csv,noheader", "-i", "0"]).stdout.strip()
    print(f"# MPS limits per claim daemon\n\nGPU 0: `{smi}`\n", file=out)
    uuid = smi.split(",")[1].strip()
    root = tempfile.mkdtemp(prefix="tessera-mps-")
    daemons = {"claim-a": (25, 4096), "claim-b": (50, 8192)}
    envs = {}
    try:
        for name, (pct, mib) in daemons.items():
            d = os.path.join(root, name)
            for sub in ("pipe", "log"):
                os.makedirs(os.path.join(d, sub))
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=uuid,
                       CUDA_MPS_PIPE_DIRECTORY=os.path.join(d, "pipe"),
                       CUDA_MPS_LOG_DIRECTORY=os.path.join(d, "log"),
                       CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(pct),
                       CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={mib}M")
            r = run(["nvidia-cuda-mps-control", "-d"], env=env)
            print(f"- daemon {name} ({pct} %, {mib} MiB): exit {r.returncode} {r.stderr.strip()}", file=out)
            envs[name] = env
        time.sleep(1)
        print("\n| client | environment | total MiB | SMs | 6 GiB allocation |\n|---|---|---|---|---|", file=out)
        cases = [
            ("claim-a", "as the CDI spec leaves it", {}),
            ("claim-a", "raises both", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
                                          "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=100000M"}),
            ("claim-a", "lowers memory to 1024M", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M"}),
            ("claim-b", "as the CDI spec leaves it", {}),
        ]
        for name, what, extra in cases:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("CUDA_MPS_") and k != "CUDA_VISIBLE_DEVICES"}
            env["CUDA_MPS_PIPE_DIRECTORY"] = envs[name]["CUDA_MPS_PIPE_DIRECTORY"]
            env.update(extra)
            r = run([sys.executable, "-c", CLIENT], env=env)
            try:
                res = json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res = {"error": r.stderr.strip()[-200:]}
            if "error" in res:
                print(f"| {name} | {what} | {res} | | |", file=out)
            else:
                print(f"| {name} | {what} | {res['total_mib']} | {res['sms']} | "
                      f"{'ok' if res['alloc_6gib'] == 0 else 'refused (' + str(res['alloc_6gib']) + ')'} |", file=out)
    finally:
        for name, env in envs.items():
            r = run(["nvidia-cuda-mps-control"], env=env, stdin="quit\n")
            print(f"\n- quit {name}: exit {r.returncode}", file=out)
        after = run(["nvidia-smi", "--query-gpu=compute_mode,mig.mode.current", "--format=csv,noheader",
                     "-i", "0"]).stdout.strip()
        print(f"- GPU 0 after: `{after}` (compute mode and MIG mode as found)", file=out)


if __name__ == "__main__":
    main()

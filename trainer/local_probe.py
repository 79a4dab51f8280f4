"""`kftrain plan --probe`: the planner's probe (:func:`trainer.plan.run_probe`) on this machine, in as
many processes as the job has ranks.

:func:`probe_locally` starts `job.replicas x job.nproc_per_node` processes with torchrun on
loopback (gloo on the CPU, NCCL where there are GPUs), each one rank of the job's process group,
and every rank runs the probe; rank 0 writes what they measured together: the slowest rank's
times (the ranks wait for each other at every gradient reduction, so the slowest one sets the
pace) and the largest peak memory. Each rank runs

    python -m trainer.local_probe --config-file FILE --manifest-file FILE --steps N --output FILE
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.config import Config, config_from_json, config_to_json
from trainer.errors import KftrainError, error_line, parse_error_line
from trainer.launch.local import JOB_MARKER_ENV, run_captured, stopped_at_exit

if TYPE_CHECKING:
    from trainer.plan import ProbeResult

#: The probe's wall-clock limit: a few steps of the real model, plus the processes' start.
PROBE_TIMEOUT_S = 600.0
#: Fields of the probe's result that are times: the slowest rank's count.
_TIMES = ("step_seconds", "compute_seconds", "data_wait_seconds", "comm_seconds")


class ProbeFailed(KftrainError):
    """The probe's processes failed or ran past their time; the message carries their last lines."""


def combine(results: list[dict]) -> dict:
    """One result from every rank's (as `ProbeResult.as_dict` gives them): rank 0's, with the
    slowest rank's times and the largest peak memory."""
    out = dict(results[0])
    for key in _TIMES:
        out[key] = max(r[key] for r in results)
    out["peak_memory_bytes"] = max(r["peak_memory_bytes"] for r in results)
    return out


def probe_locally(
    cfg: Config, steps: int = 5, timeout_s: float = PROBE_TIMEOUT_S, repeats: int = 1, manifest: dict | None = None
) -> list[ProbeResult]:
    """Run the probe of `cfg` `repeats` times in the same `job.world_size` local processes; return
    the combined result of each repeat. `manifest`: the prepared dataset's, which the model is
    built from (was: the plan's guess, for `plan --probe --dataset` too). :class:`ProbeFailed`
    with the processes' last lines when they fail or run past `timeout_s`."""
    from trainer.plan import ProbeResult

    world = cfg.job.world_size
    # Removed however the probe ends, by its watchdog too when this process is killed.
    with tempfile.TemporaryDirectory(prefix="kftrain-probe-", ignore_cleanup_errors=True) as tmp:
        config_file, output = Path(tmp) / "config.json", Path(tmp) / "probe.json"
        config_file.write_text(config_to_json(cfg))
        manifest_file = Path(tmp) / "manifest.json"
        manifest_file.write_text(json.dumps(manifest))
        cmd = [
            sys.executable,
            "-m",
            "trainer.torchrun",
            "--standalone",
            "--nnodes=1",
            f"--nproc-per-node={world}",
            "-m",
            "trainer.local_probe",
            f"--config-file={config_file}",
            f"--manifest-file={manifest_file}",
            f"--steps={steps}",
            f"--repeats={repeats}",
            f"--output={output}",
        ]
        # torchrun starts its workers in sessions of their own, out of reach of a signal to its
        # process group: every process of the probe carries a marker, and they all stop when the
        # probe ends, whether it returns, raises (a time limit, Ctrl-C) or this process is killed.
        marker = f"probe-{secrets.token_hex(6)}"
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(cfg.job.omp_num_threads),
            JOB_MARKER_ENV: marker,
            "TMPDIR": tmp,  # torchrun's own temporary files too
        }
        try:
            with stopped_at_exit(marker, JOB_MARKER_ENV, grace_s=5.0, remove=tmp):
                returncode, out = run_captured(cmd, timeout_s, env=env)
                results = json.loads(output.read_text()) if returncode == 0 and output.is_file() else None
        except subprocess.TimeoutExpired:
            raise ProbeFailed(
                f"the probe ({world} process(es), {steps} steps) did not finish within {timeout_s:.0f}s; "
                "run `kftrain plan` without --probe, or with fewer --probe-steps"
            ) from None
        if results is None:
            said = [parsed[1] for parsed in map(parse_error_line, out.splitlines()) if parsed]
            if said:  # a rank's own error (a config the probe cannot run): that one line
                raise ProbeFailed(f"the probe failed: {said[0]}")
            raise ProbeFailed(probe_failure(returncode, out.splitlines()))
        return [ProbeResult(**result) for result in results]


def probe_failure(returncode: int, out: list[str]) -> str:
    """Why the probe failed, from torchrun's exit code and output `out`: what the ranks printed
    (:func:`trainer.launch.backend.failure_excerpt`), not torchrun's summary of which one died."""
    from trainer.launch.backend import failure_excerpt

    lines = "\n".join(f"  {line}" for line in failure_excerpt(out, tail=20))
    return f"the probe failed (exit code {returncode}); its last lines:\n{lines}"


def main(argv: list[str] | None = None) -> int:
    """One rank of the probe (under torchrun)."""
    import torch.distributed as dist

    from trainer.distributed import device_for, dist_env, process_group, unused_parameters
    from trainer.plan import run_probe
    from trainer.stacks import print_stacks_on_signals

    parser = argparse.ArgumentParser(prog="python -m trainer.local_probe", description=__doc__)
    parser.add_argument("--config-file", required=True, help="the whole config as JSON")
    parser.add_argument("--manifest-file", help="the prepared dataset's manifest as JSON (null: none)")
    parser.add_argument("--steps", type=int, required=True, help="measured steps")
    parser.add_argument("--repeats", type=int, default=1, help="probes run one after the other")
    parser.add_argument("--output", required=True, help="where rank 0 writes the combined results (JSON list)")
    args = parser.parse_args(argv)
    print_stacks_on_signals()
    cfg = config_from_json(Path(args.config_file).read_text())
    manifest = json.loads(Path(args.manifest_file).read_text()) if args.manifest_file else None
    env = dist_env()
    device = device_for(env)
    try:
        with process_group(env, device, timeout_s=cfg.job.collective_timeout_seconds):
            combined = []
            for _ in range(args.repeats):
                mine = run_probe(cfg, steps=args.steps, manifest=manifest).as_dict()
                results = [mine]
                if env.distributed:
                    results = [None] * env.world_size
                    dist.all_gather_object(results, mine)
                combined.append(combine(results))
    except KftrainError as exc:
        print(error_line("probe", exc), flush=True)
        return 2
    except RuntimeError as exc:
        if not (unused := unused_parameters(exc)):
            raise
        print(error_line("probe", KftrainError(unused)), flush=True)
        return 2
    if env.is_main:
        Path(args.output).write_text(json.dumps(combined))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU check's verdict (benches/gpu_check.py): each check judged from the report alone, and the table it prints."""

from __future__ import annotations

from dataclasses import dataclass

from specbench.core.summary import NEAR_TIE_GAP


NOT_ON_GPU = "not on a GPU"
CONTEXT_SLACK_MB = 512.0  # NVML: kernels loaded after the CUDA context was measured (cuBLAS', inductor's); no model


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "passed", "failed" or "skipped"
    detail: str


# --- the verdict, the table, the file ----------------------------------------------------------------------------

def judge(report: dict) -> list[Check]:
    """The checks, from the report alone; a check whose phase did not run is skipped as "not reached"."""
    runs = [run for run in report.get("runs", []) if "greedy" in run]
    checks = [Check("completed", "failed", report["error"])] if "error" in report else []
    checks += [_equality(runs), _validity(runs)]
    if not report.get("device", "").startswith("cuda"):
        return checks + [Check(name, "skipped", NOT_ON_GPU) for name in ("cuda graphs captured", "energy per token",
                                                                          "nothing left on the gpu")] + [
            Check("unit tests on cuda", "skipped", f"{NOT_ON_GPU} (make test runs them on the CPU)")]
    graphs = report.get("static", {}).get("cuda_graphs")
    return checks + [_graphs(graphs, compiled=report["compile"]), _energy(runs), _leftover(report.get("leftover")),
                     _unit_tests(report.get("unit_tests"))]


def _equality(runs: list[dict]) -> Check:
    if not runs:
        return Check("greedy equality", "skipped", "not reached")
    broken = [f"{run['mode']} {run['method']}, prompt {b['prompt']}, token {b['position']} (top-2 gap "
              f"{b['top2_gap']})" for run in runs for b in run["greedy"]["broken"]]
    identical, compared = (sum(run["greedy"][key] for run in runs) for key in ("identical", "compared"))
    near = sum(len(run["greedy"]["near_ties"]) for run in runs)
    return Check("greedy equality", "failed" if broken else "passed", "; ".join(broken) or (
        f"{identical} of {compared} requests identical to the eager baseline's output, {near} first parted from it "
        f"at a near-tie (top-2 gap <= {NEAR_TIE_GAP})"))


def _validity(runs: list[dict]) -> Check:
    if not runs:
        return Check("greedy validity", "skipped", "not reached")
    off = [f"{run['mode']} {run['method']} ({run['max_choice_deficit']:.3g})" for run in runs
           if run["max_choice_deficit"] > NEAR_TIE_GAP]
    if off:
        return Check("greedy validity", "failed", f"tokens below the target's top logit by more than {NEAR_TIE_GAP}: "
                     + ", ".join(off))
    worst = max(run["max_choice_deficit"] for run in runs)
    return Check("greedy validity", "passed",
                 f"every output token is the target's choice given its prefix (worst shortfall {worst:.3g})")


def _graphs(graphs: dict | None, *, compiled: bool) -> Check:
    if graphs is None:
        return Check("cuda graphs captured", "skipped", "not reached" if compiled else "not compiled")
    ok = graphs["captured"] is not None and graphs["captured"] > 0 and graphs["skipped"] == 0
    return Check("cuda graphs captured", "passed" if ok else "failed",
                 f"{graphs['captured']} captured (None: this torch does not tell), {graphs['skipped']} skipped")


def _energy(runs: list[dict]) -> Check:
    if not runs:
        return Check("energy per token", "skipped", "not reached")
    energy = [run["energy_j_per_token"] for run in runs]
    if None in energy:
        return Check("energy per token", "skipped", runs[energy.index(None)]["unmeasured"]["energy_j_per_token"])
    return Check("energy per token", "passed", f"{min(energy):.3g}-{max(energy):.3g} J per output token")


def _leftover(left: dict | None) -> Check:
    if not left:
        return Check("nothing left on the gpu", "skipped", "not reached")
    held, context = left["nvml_process_mb"], left["nvml_context_mb"]
    problems = [f"{left['allocated_bytes'] / 2**20:.1f} MiB still allocated"] if left["allocated_bytes"] else []
    if None not in (held, context) and held > context + CONTEXT_SLACK_MB:
        problems.append(f"NVML: more than the CUDA context + {CONTEXT_SLACK_MB:.0f} MiB")
    nvml = ("NVML: no figure for this process" if None in (held, context) else
            f"NVML: this process holds {held:.0f} MiB, its CUDA context held {context:.0f} MiB")
    return Check("nothing left on the gpu", "failed" if problems else "passed",
                 "; ".join([*problems, f"{left['reserved_bytes']} bytes reserved", nvml]))


def _unit_tests(results: dict | None) -> Check:
    if not results:
        return Check("unit tests on cuda", "skipped", "not reached")
    bad = [f"{path}: {result['status']}" for path, result in results.items() if result["status"] != "passed"]
    return Check("unit tests on cuda", "failed" if bad else "passed", "; ".join(bad) or ", ".join(
        f"{path}: {result['tests'] - result['skipped']} passed" for path, result in results.items()))


def render(report: dict, checks: list[Check]) -> str:
    settings, parameters = report.get("settings", {}), report.get("models", {}).get("target", {}).get("parameters", 0)

    def cell(value, form: str) -> str:
        return "-" if value is None else format(value, form)

    lines = [f"gpu check on {report.get('machine', {}).get('device', '?')}: {report.get('dtype')}, target "
             f"{parameters / 1e6:,.1f}M parameters, gamma {settings.get('gamma')}, {settings.get('prompts')} prompts "
             f"x {settings.get('max_new_tokens')} tokens, greedy",
             f"{'mode':<9}{'method':<13}{'tok/s':>8}{'MAL':>6}{'accept':>8}{'identical':>10}{'peak MiB':>10}"
             f"{'NVML MiB':>10}{'J/token':>9}"]
    for run in report.get("runs", []):
        greedy = run.get("greedy")
        lines.append(f"{run['mode']:<9}{run['method']:<13}{run['tokens_per_s']:>8.1f}"
                     f"{cell(run['mean_accepted_length'], '.2f'):>6}{cell(run['acceptance_rate'], '.0%'):>8}"
                     + (f"{greedy['identical']:>6}/{greedy['compared']:<3}" if greedy else f"{'-':>10}")
                     + f"{cell(run['peak_memory_reserved_mb'], '.0f'):>10}{cell(run['nvml_peak_memory_mb'], '.0f'):>10}"
                     f"{cell(run['energy_j_per_token'], '.3f'):>9}")
    return "\n".join(lines + [f"{check.status:<8}{check.name}: {check.detail}" for check in checks])



"""The benchmark suite's configurations and measurements: what runs, how often, on which family."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mergepipe.cli.family import generate_family, read_family
from mergepipe.core.operators import get_operator
from mergepipe_bench.coldcache import files_under, make_cold, resident_bytes, resident_fraction
from mergepipe_bench.mergekit_run import mergekit_config, write_config
from mergepipe_bench.worker import WorkerClient

OPERATORS = ("linear", "task_arithmetic", "ties", "dare_ties")
RSS_RUNS = (("ours", "linear"), ("ours", "ties"), ("mergekit", "linear"))


@dataclass(frozen=True)
class SuiteConfig:
    """What the suite measures, and at which sizes."""

    name: str
    size_mb: float  # per checkpoint
    ks: tuple[int, ...]  # expert counts of the scaling figure
    k_main: int  # K of the budget sweep, the operator table and the physical limit
    lora_experts: int  # LoRA-like experts among the max(ks) experts
    reps: int
    budgets: tuple[float, ...]  # budget sweep fractions
    sweep_operators: tuple[str, ...] = ("ties", "linear")
    scaling_operator: str = "linear"
    low_budget: float = 0.1  # the budgeted point of the operator table
    k_big: int = 16  # K of the second budgeted row against mergekit (docs/targets.md: 5x for linear)
    big_operators: tuple[str, ...] = ("linear", "ties")
    one_d_mib: int = 256  # the 1-D tensor of the ingestion RSS row
    fixed_budget_share: float = 0.1  # scaling figure: fixed bytes = share x full read at k_main
    rss_sizes_mb: tuple[float, ...] = (50.0, 200.0)  # peak RSS at these checkpoint sizes
    rss_k: int = 4
    density: float = 0.5
    seed: int = 0
    # mergekit's ties/dare_ties take minutes per run at the default size: measured this often.
    slow_reps: int = 1
    slow_runs: tuple[str, ...] = ("mergekit/ties/", "mergekit/dare_ties/")

    def reps_of(self, run: Run) -> int:
        """Repetitions of `run` (fewer for the slow mergekit configurations)."""
        if any(run.key.startswith(s) for s in self.slow_runs):
            return min(self.reps, self.slow_reps)
        return self.reps

    @property
    def k_max(self) -> int:
        return max((*self.ks, self.k_main, self.rss_k, self.k_big))


DEFAULT = SuiteConfig("default", 200.0, (2, 4, 8, 16), 8, 4, 3,
                      (0.1, 0.2, 0.3, 0.5, 0.75, 1.0))
QUICK = SuiteConfig("quick", 1.0, (1, 2), 2, 1, 1, (0.5, 1.0), low_budget=0.5,
                    rss_sizes_mb=(0.5, 1.0), rss_k=2, k_big=2, one_d_mib=4)


@dataclass
class Sample:
    """One timed run."""

    wall_s: float  # job round trip in the warm worker
    merge_s: float  # the merge call itself, in process
    cold: float  # share of the inputs resident in the page cache when the run started
    disk_expert_bytes: int  # expert bytes brought into the page cache by the run (mincore)
    disk_base_bytes: int
    peak_rss: int  # VmHWM of the worker during the job (reset before it)
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    """One configuration: tool, operator, K, budget ("f:0.1", "b:123" or "full"), family."""

    tool: str
    op: str
    k: int
    budget: str = "full"
    family: str = "main"

    @property
    def key(self) -> str:
        return f"{self.tool}/{self.op}/K{self.k}/{self.budget}/{self.family}"


class Suite:
    """Families, catalogs, warm workers, the cold-cache protocol and the measured samples."""

    def __init__(self, cfg: SuiteConfig, out: Path, log: Any = print) -> None:
        self.cfg, self.out, self.log = cfg, out.absolute(), log
        self.work = self.out / "work"
        self.samples: dict[str, list[Sample]] = {}
        self.keep: dict[str, Path] = {}  # run key -> output dir of its first repetition
        self.families: dict[str, Path] = {}
        self.catalogs: dict[str, Path] = {}
        self.setup_info: dict[str, Any] = {}
        self.workers: dict[str, WorkerClient] = {}
        self.imports: dict[str, list[dict[str, float]]] = {}
        self.cold_max = 0.0

    # -- setup ------------------------------------------------------------------------------
    def family_sizes(self) -> dict[str, tuple[float, int]]:
        sizes = {"main": (self.cfg.size_mb, self.cfg.k_max)}
        for mb in self.cfg.rss_sizes_mb:
            if mb != self.cfg.size_mb:
                sizes[family_name(self.cfg, mb)] = (mb, self.cfg.rss_k)
        return sizes

    def setup(self) -> None:
        """Generate (or reuse) the families and ingest each into its own catalog."""
        for name, (mb, k) in self.family_sizes().items():
            root = self.work / f"family-{name}"
            lora = self.cfg.lora_experts if name == "main" else 0
            want = {"size_mb": mb, "experts": k, "lora": lora, "seed": self.cfg.seed}
            stamp = root / "bench-stamp.json"
            catalog = root / "catalog.duckdb"
            old = json.loads(stamp.read_text()) if stamp.exists() else {}
            if {k: old.get(k) for k in want} == want and catalog.exists():
                self.log(f"reusing family {name} and its catalog in {root}")
                info = {**old, "reused": "family and catalog"}
            elif {k: old.get(k) for k in want} == want:
                self.log(f"reusing family {name} in {root}; ingesting with statistics")
                info = {**old, "reused": "family", "ingest_s": ingest_family(root, catalog)}
                stamp.write_text(json.dumps({**info, "reused": None}))
                self.log(f"  ingested in {info['ingest_s']:.1f} s")
            else:
                shutil.rmtree(root, ignore_errors=True)
                t0 = time.perf_counter()
                self.log(f"generating family {name}: base + {k} experts x {mb:g} MB")
                generate_family(root, experts=k, size_mb=mb, seed=self.cfg.seed,
                                lora_experts=lora)
                gen_s = time.perf_counter() - t0
                self.log(f"  {gen_s:.1f} s; ingesting with statistics")
                ingest_s = ingest_family(root, catalog)
                info = {**want, "generate_s": gen_s, "ingest_s": ingest_s}
                stamp.write_text(json.dumps(info))
                self.log(f"  ingested in {ingest_s:.1f} s")
            fam = read_family(root)
            self.families[name] = root
            self.catalogs[name] = catalog
            ckpt_bytes = sum(f.stat().st_size for f in root.rglob("*.safetensors"))
            self.setup_info[name] = {
                **info, "checkpoint_bytes": fam["checkpoint_bytes"], "shape": fam["shape"],
                "family_bytes": ckpt_bytes, "catalog_bytes": catalog.stat().st_size,
                "lora_like": [e["name"] for e in fam["experts"] if e["lora_like"]]}

    def experts(self, family: str, k: int) -> list[str]:
        return [e["name"] for e in read_family(self.families[family])["experts"][:k]]

    # -- one run ----------------------------------------------------------------------------
    def worker(self, tool: str) -> WorkerClient:
        w = self.workers.get(tool)
        if w is None or w.proc.poll() is not None:
            w = self.workers[tool] = WorkerClient(tool, self.out / "logs" / f"{tool}.log")
            self.imports.setdefault(tool, []).append(
                {"import_s": w.import_s, "idle_rss": w.idle_rss})
        return w

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()

    def request(self, run: Run) -> dict[str, Any]:
        params: dict[str, Any] = {"normalize": get_operator(run.op).normalize_default}
        if run.op in ("ties", "dare_ties"):
            params["density"] = self.cfg.density
        budget: Any = 1.0
        if run.budget.startswith("f:"):
            budget = float(run.budget[2:])
        elif run.budget.startswith("b:"):
            budget = f"{int(run.budget[2:])}B"
        return {"base": "base", "experts": [{"model": e} for e in self.experts(run.family, run.k)],
                "operator": run.op, "params": params, "budget": budget, "seed": self.cfg.seed}

    def job(self, run: Run, rundir: Path) -> tuple[dict[str, Any], list[str]]:
        """The worker job of `run` and the input paths it may read."""
        root = self.families[run.family]
        experts = [root / e for e in self.experts(run.family, run.k)]
        inputs = [str(root / "base"), *map(str, experts)]
        if run.tool == "mergekit":
            req = self.request(run)
            cfg = mergekit_config(run.op, root / "base", experts, params=req["params"])
            path = write_config(cfg, rundir / "mergekit.yml")
            return {"config": str(path), "out": str(rundir / "out"), "seed": self.cfg.seed}, inputs
        catalog = rundir / "catalog.duckdb"
        shutil.copyfile(self.catalogs[run.family], catalog)
        return ({"catalog": str(catalog), "request": self.request(run),
                 "out": str(rundir / "out")}, [*inputs, str(catalog)])

    def measure(self, run: Run, rep: int) -> Sample:
        """One cold run of `run` in its warm worker."""
        rundir = self.work / "runs" / run.key.replace("/", "_") / f"rep{rep}"
        shutil.rmtree(rundir, ignore_errors=True)
        rundir.mkdir(parents=True)
        job, inputs = self.job(run, rundir)
        worker = self.worker(run.tool)
        files = make_cold(inputs)
        cold = resident_fraction(files)
        self.cold_max = max(self.cold_max, cold)
        result = worker.run(job)
        root = self.families[run.family]
        base_files = files_under([root / "base"])
        expert_files = [f for f in files if f not in base_files and not f.endswith(".duckdb")]
        sample = Sample(result["wall_s"], result["merge_s"], cold,
                        sum(resident_bytes(f) for f in expert_files),
                        sum(resident_bytes(f) for f in base_files), int(result["peak_rss"]),
                        result)
        if rep == 0:
            self.keep[run.key] = rundir
        else:
            shutil.rmtree(rundir)
        self.log(f"  {run.key} rep {rep}: {sample.merge_s:.2f} s merge, "
                 f"{sample.disk_expert_bytes / 1e6:.0f} MB experts from disk")
        return sample

    def measure_all(self, runs: list[Run]) -> None:
        """Every run `reps` times; each repetition goes through all runs in order."""
        unique = list(dict.fromkeys(runs))
        for rep in range(self.cfg.reps):
            self.log(f"repetition {rep + 1}/{self.cfg.reps}: {len(unique)} runs")
            for run in unique:
                if rep < self.cfg.reps_of(run):
                    self.samples.setdefault(run.key, []).append(self.measure(run, rep))

    # -- derived ----------------------------------------------------------------------------
    def median(self, run: Run, attr: str = "merge_s") -> float:
        return statistics.median(getattr(s, attr) for s in self.samples[run.key])

    def median_result(self, run: Run, key: str) -> float:
        return statistics.median(float(_dig(s.result, key)) for s in self.samples[run.key])

    def first(self, run: Run) -> dict[str, Any]:
        return self.samples[run.key][0].result

    def output(self, run: Run) -> Path:
        return self.keep[run.key] / "out"


def _dig(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d


def ingest_family(root: Path, catalog: Path) -> float:
    """Ingest base and experts (statistics on; two experts scanned at a time); seconds."""
    from mergepipe.catalog.db import Catalog
    from mergepipe.catalog.ingest import ingest_model

    catalog.unlink(missing_ok=True)
    fam = read_family(root)
    t0 = time.perf_counter()
    with Catalog(catalog) as cat:
        ingest_model(cat, root / "base", "base")
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(ingest_model, cat, root / e["name"], e["name"], base="base")
                       for e in fam["experts"]]
            for f in futures:
                f.result()
    return time.perf_counter() - t0


def plan_runs(cfg: SuiteConfig, full_read_k_main: int | None = None) -> dict[str, list[Run]]:
    """The configurations of each figure (shared ones are measured once)."""
    main = cfg.k_main
    fixed = f"b:{full_read_k_main}" if full_read_k_main else f"f:{cfg.fixed_budget_share}"
    scaling = []
    for k in cfg.ks:
        scaling += [Run("mergekit", cfg.scaling_operator, k), Run("ours", cfg.scaling_operator, k),
                    Run("ours", cfg.scaling_operator, k, fixed)]
    operators = []
    for op in OPERATORS:
        operators += [Run("mergekit", op, main), Run("ours", op, main),
                      Run("ours", op, main, f"f:{cfg.low_budget}")]
    sweep = [Run("ours", op, main, "full" if b >= 1 else f"f:{b}")
             for op in cfg.sweep_operators for b in cfg.budgets]
    rss = [Run(tool, op, cfg.rss_k, "full", family_name(cfg, mb)) for mb in cfg.rss_sizes_mb
           for tool, op in RSS_RUNS]
    big = [run for op in cfg.big_operators
           for run in (Run("mergekit", op, cfg.k_big), Run("ours", op, cfg.k_big,
                                                            f"f:{cfg.low_budget}"))]
    return {"scaling": scaling, "operators": operators, "sweep": sweep, "rss": rss, "big": big}


def family_name(cfg: SuiteConfig, size_mb: float) -> str:
    """The family of checkpoints of `size_mb`: the main one, or a smaller one for RSS."""
    return "main" if size_mb == cfg.size_mb else f"rss{size_mb:g}"

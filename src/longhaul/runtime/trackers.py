"""The trackers a run reports to besides `metrics.jsonl`: TensorBoard, MLflow, W&B and Trackio.

`metrics.jsonl` stays the source of truth (resume, the console and `report.html` read it); a
tracker gets a copy for the dashboards people already use: the resolved config once, each step's
finite scalars (renamed by `TRACKER_NAMES` where TRL or verl call the quantity otherwise), and
every `log.tables_every` steps a table of the step's sampled episodes (task, prompt, completion or
whole trajectory, reward, pass). Each back end runs in its local mode and nothing goes over the
network: MLflow's SQLite store, W&B offline, Trackio's SQLite store, all under the run directory.

A tracker is a class with three methods (`log_scalars`, `log_table`, `close`); opening it logs
the config. Not here: uploading (`wandb sync`, an MLflow server or a Trackio Space are the
user's to point at the files).

On `--resume` each tracker continues the run it opened before instead of starting another: the
TensorBoard writer purges the events past the checkpoint's step, MLflow and W&B reopen the run
whose id they kept in their directory (`run_id`), Trackio resumes the run of the same name. The
steps between the checkpoint and the interruption are logged again; MLflow keeps both values of
those steps in a metric's history (its store has no way to drop them), the others show the new.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
import uuid
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Callable, Protocol

from longhaul.errors import LonghaulError

# metrics.jsonl names that TRL's GRPOTrainer or verl spell otherwise; every other name passes
# unchanged (the rest already are TRL's: reward, reward_std, frac_reward_zero_std, kl, entropy,
# loss, grad_norm, clip_ratio/*, completions/*, num_tokens). A key ending in "/" renames a prefix.
TRACKER_NAMES = {
    "lr": "learning_rate",  # TRL
    "step_time": "timing_s/step",  # verl
    "timing/": "timing_s/",  # verl: timing_s/gen, timing_s/update_actor, ...
    "tokens_per_s": "perf/throughput",  # verl (here: sampled plus trained tokens a second, all workers)
}

TABLE_COLUMNS = ("step", "task", "prompt", "completion", "reward", "passed")


def tracker_name(key: str) -> str:
    """The name a tracker shows for the metrics.jsonl key `key`."""
    if key in TRACKER_NAMES:
        return TRACKER_NAMES[key]
    prefix = next((p for p in TRACKER_NAMES if p.endswith("/") and key.startswith(p)), None)
    return TRACKER_NAMES[prefix] + key[len(prefix):] if prefix else key


def tracker_scalars(metrics: dict) -> dict[str, float]:
    """A metrics row's finite numbers under their tracker names (flags, text and NaN left out)."""
    return {tracker_name(k): float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "step"}


def flat_config(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys and text values (MLflow's params are flat strings)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, str) else json.dumps(v)
    return out


class Tracker(Protocol):
    def log_scalars(self, step: int, scalars: dict[str, float]) -> None: ...
    def log_table(self, step: int, rows: list[dict]) -> None: ...
    def close(self) -> None: ...


def _kept_id(d: Path, resume_step: int | None) -> str | None:
    """The id a tracker kept in `d/run_id` when the run was first opened, on a resume."""
    path = d / "run_id"
    if resume_step is None or not path.is_file():
        return None
    return path.read_text().strip() or None


def _keep_id(d: Path, run_id: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "run_id.tmp"
    tmp.write_text(run_id + "\n")
    os.replace(tmp, d / "run_id")


class TensorBoard:
    """Scalars and the config as text; no tables (its text plugin keeps 10 samples: see the console)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        # a resume: TensorBoard drops the events of the steps after the checkpoint's when it reads the log
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=None if resume_step is None else resume_step + 1)
        if resume_step is None:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```")

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_table(self, step: int, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        self.writer.close()


class MLflow:
    """A run in the SQLite store `mlflow/mlflow.db` (artifacts beside it): the config as params,
    each table as the artifact `rollouts/step_<N>.json` (one file a step: earlier tables stay)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, resume_step: int | None = None):
        from mlflow import MlflowClient
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        root = (run_dir / "mlflow").resolve()
        root.mkdir(exist_ok=True)
        self.uri = f"sqlite:///{root / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(project, artifact_location=(root / "artifacts").as_uri())
        kept = _kept_id(root, resume_step)
        if kept is not None:  # the run this one continues: its params were logged when it began
            self.run_id = kept
            self.client.update_run(kept, status="RUNNING")
            return
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        _keep_id(root, self.run_id)
        params = [Param(k, v[:MAX_PARAM_VAL_LENGTH]) for k, v in flat_config(config).items()]
        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS_TAGS_PER_BATCH])

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def log_table(self, step: int, rows: list[dict]) -> None:
        self.client.log_table(self.run_id, {c: [r[c] for r in rows] for c in TABLE_COLUMNS}, f"rollouts/step_{step}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandB:
    """An offline run under `wandb/` (upload it later with `wandb sync`), tables as `wandb.Table`."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, resume_step: int | None = None):
        import wandb

        self.wandb = wandb
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True, save_code=False)
        kept = _kept_id(run_dir / "wandb", resume_step)
        run_id = kept or uuid.uuid4().hex[:8]
        self.run = wandb.init(project=project, name=name, dir=str(run_dir), mode="offline", config=config, id=run_id,
                              resume="allow" if kept else None, reinit="create_new", settings=settings)
        _keep_id(run_dir / "wandb", run_id)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_table(self, step: int, rows: list[dict]) -> None:
        table = self.wandb.Table(columns=list(TABLE_COLUMNS), data=[[r[c] for c in TABLE_COLUMNS] for r in rows])
        self.run.log({"rollouts": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio:
    """A run in Trackio's SQLite store `trackio/<project>.db`; see it with
    `TRACKIO_DIR=runs/<name>/trackio trackio show`. Trackio reads TRACKIO_DIR once, when first
    imported (transformers' integrations may import it earlier), and its modules each keep the
    directory in a global of their own: every one of them is pointed at this run's store."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, resume_step: int | None = None):
        for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
            if os.environ.get(var):
                raise LonghaulError(f"{var} is set, but longhaul logs to Trackio's local store only; unset {var}")
        store = (run_dir / "trackio").resolve()
        os.environ["TRACKIO_DIR"] = str(store)
        import trackio
        import trackio.sqlite_storage  # noqa: F401  (one of the modules holding the directory)

        for mod in [m for k, m in list(sys.modules.items()) if k == "trackio" or k.startswith("trackio.")]:
            if isinstance(getattr(mod, "TRACKIO_DIR", None), Path):
                mod.TRACKIO_DIR = store
        self.trackio = trackio
        with contextlib.redirect_stdout(io.StringIO()):  # its dashboard hints: open() prints one line instead
            self.run = trackio.init(project=project, name=name, config=config, embed=False, auto_log_gpu=False,
                                    auto_log_cpu=False, resume="never" if resume_step is None else "allow")

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_table(self, step: int, rows: list[dict]) -> None:
        self.run.log({"rollouts": self.trackio.Table(columns=list(TABLE_COLUMNS), data=[[r[c] for c in TABLE_COLUMNS] for r in rows])},
                     step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.trackio.finish()  # the current run, ours: its init finished any earlier one


@dataclass(frozen=True)
class Backend:
    tracker: Callable[[Path, str, str, dict, int | None], Tracker]
    modules: tuple[str, ...]  # what must be importable
    pip: str  # what installs them (all are in longhaul[trackers])
    where: str  # where the run's data lands, for the line printed at the start

    def missing(self) -> str | None:
        """The first of `modules` that cannot be imported, or None."""
        for m in self.modules:
            try:
                if find_spec(m) is None:
                    return m
            except (ImportError, ValueError):  # ValueError: sys.modules[m] is None (an import that was blocked)
                return m
        return None


# MLflow 3's file store refuses new runs (maintenance mode) unless told otherwise, and the SQLite
# store needs sqlalchemy and alembic, which the full mlflow package brings and mlflow-skinny does not
TRACKERS: dict[str, Backend] = {
    "tensorboard": Backend(TensorBoard, ("tensorboard",), "tensorboard", "tensorboard/ (tensorboard --logdir {run_dir}/tensorboard)"),
    "mlflow": Backend(MLflow, ("mlflow", "sqlalchemy", "alembic"), "mlflow-skinny sqlalchemy alembic",
                      "mlflow/mlflow.db (mlflow ui --backend-store-uri sqlite:///{run_dir}/mlflow/mlflow.db)"),
    "wandb": Backend(WandB, ("wandb",), "wandb", "wandb/offline-run-* (wandb sync {run_dir}/wandb/offline-run-*)"),
    "trackio": Backend(Trackio, ("trackio",), "trackio", "trackio/ (TRACKIO_DIR={run_dir}/trackio trackio show)"),
}


def require(names: list[str]) -> None:
    """Refuse, in one line, a tracker whose package is not installed (before anything is written)."""
    for name in names:
        b = TRACKERS[name]
        if (m := b.missing()) is not None:
            raise LonghaulError(f"log.report_to names {name}, but {m} is not installed: pip install 'longhaul[trackers]' "
                                f"(or pip install {b.pip}), or take {name} out of log.report_to")


def resolve(report_to: list[str] | None) -> list[str]:
    """The trackers a run opens: report_to as given; None (the default) is TensorBoard when installed."""
    if report_to is not None:
        return list(report_to)
    if TRACKERS["tensorboard"].missing() is None:
        return ["tensorboard"]
    print("note: tensorboard is not installed; metrics go to metrics.jsonl only (pip install tensorboard)")
    return []


def open_trackers(names: list[str], run_dir: Path, project: str, name: str, config: dict,
                  resume_step: int | None = None) -> list[Tracker]:
    """Each named tracker opened on the run, the config logged; one line each says where it writes.
    `resume_step`: the run resumes from that step's checkpoint, and each tracker continues its run."""
    require(names)
    out = []
    try:
        for n in names:
            out.append(TRACKERS[n].tracker(run_dir, project, name, config, resume_step))
            print(f"{n}: {run_dir}/{TRACKERS[n].where.format(run_dir=run_dir)}")
    except BaseException:
        for t in out:
            t.close()
        raise
    return out

"""The main job (examples/train_ctr.py) in a short version, and the quickstart."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "train_ctr.py")


def _run(*args, timeout=300):
    result = subprocess.run(
        [sys.executable, SCRIPT, "--quiet", *args], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _held_out_auc(output):
    line = [l for l in output.splitlines() if l.strip().startswith("held-out AUC")][-1]
    return float(line.split()[2])


def test_short_training_beats_the_majority_baseline(tmp_path):
    out = _run("--train-samples", "150000", "--test-samples", "20000", "--epochs", "1",
               "--plot", str(tmp_path / "curves.png"))
    assert _held_out_auc(out) > 0.75, out  # majority-class baseline: 0.5
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert "1,000,000,000 rows in the table" in out and "materialized" in out


def test_counts_below_one_are_refused_by_name():
    # --eval-every 0 once ended in ZeroDivisionError after the data was drawn.
    for flag in ("--eval-every", "--batch-size", "--epochs", "--checkpoint-every-steps"):
        result = subprocess.run([sys.executable, SCRIPT, flag, "0"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        assert f"argument {flag}: must be at least 1, got 0" in result.stderr, result.stderr
    result = subprocess.run([sys.executable, SCRIPT, "--eval-every", "ten"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "argument --eval-every: must be a whole number of at least 1, got 'ten'" in result.stderr


def test_training_with_the_mlp_under_bfloat16_autocast(tmp_path):
    out = _run("--train-samples", "60000", "--test-samples", "10000", "--epochs", "1", "--autocast", "bf16",
               "--plot", "")
    assert _held_out_auc(out) > 0.7, out  # majority-class baseline: 0.5


def test_training_under_a_row_budget_with_admission(tmp_path):
    out = _run("--train-samples", "60000", "--test-samples", "10000", "--epochs", "1", "--max-rows", "3000",
               "--admit-after", "2", "--plot", "")
    materialized = [int(line.split("rows in the table,")[1].split()[0].replace(",", ""))
                    for line in out.splitlines() if "materialized" in line]
    assert materialized and max(materialized) <= 3000, out
    evicted = int(out.split("admit_after 2: ")[1].split()[0].replace(",", ""))
    assert evicted > 0, out
    assert _held_out_auc(out) > 0.6, out  # majority-class baseline: 0.5


def test_checkpoint_then_resume_in_a_fresh_process(tmp_path):
    ckpt = tmp_path / "ckpt"
    common = ["--train-samples", "60000", "--test-samples", "10000", "--checkpoint", str(ckpt), "--plot", ""]
    _run(*common, "--epochs", "1")
    assert (ckpt / "tables.recdev").exists() and (ckpt / "dense.pt").exists()
    out = _run(*common, "--epochs", "2")
    assert "resumed from" in out and "after epoch 1" in out
    assert "epoch 2:" in out and "epoch 1:" not in out
    assert _held_out_auc(out) > 0.7


def test_quickstart_runs():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "parameters live on recdev:0" in result.stdout


def test_main_job_on_two_server_shards_with_checkpoint_and_resume(tmp_path):
    from torch_recdev import local_shards

    servers = local_shards.start_shards(2, log_dir=str(tmp_path))
    try:
        ckpt = tmp_path / "ckpt"
        common = ["--servers", local_shards.server_list(servers), "--train-samples", "60000",
                  "--test-samples", "10000", "--checkpoint", str(ckpt), "--plot", ""]
        out = _run(*common, "--epochs", "1")
        assert "'kind': 'remote'" in out and "'shards': 2" in out, out
        assert (ckpt / "tables.recdev").exists()
        out = _run(*common, "--epochs", "2")
        assert "resumed from" in out and "epoch 2:" in out
        assert _held_out_auc(out) > 0.7
    finally:
        for server in servers:
            server.kill()


def test_fleet_demo_two_trainers_two_shards_checkpoint_and_resume(tmp_path):
    # make fleet-demo's launcher, short: fresh shards each run, the servers named on rank 0 only; the
    # second run resumes from the first one's checkpoint (rank 0 loads into its new shards, all declare).
    ckpt = tmp_path / "ckpt"
    common = ["--quiet", "--train-samples", "60000", "--test-samples", "10000", "--eval-every", "10",
              "--checkpoint", str(ckpt), "--plot", str(tmp_path / "curves.png")]

    def fleet(*args):
        result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "fleet_demo.py"), "--", *common, *args],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    out = fleet("--epochs", "1")
    assert "fleet: 2 trainers" in out and "'shards': 2" in out and "stopped the 2 shards" in out
    assert out.count("epoch 1:") == 1  # rank 0 alone reports
    assert "(2 trainers)" in out and (ckpt / "tables.recdev").exists()
    out = fleet("--epochs", "2")
    assert "resumed from" in out and "after epoch 1" in out and "epoch 2:" in out and "epoch 1:" not in out
    assert _held_out_auc(out) > 0.7
    # The held-out subsample every 10 steps: 30 steps in the epoch, a curve of 3 points, not one.
    evaluations = [l for l in out.splitlines() if "learning curves:" in l][-1]
    assert "(3 evaluations)" in evaluations, evaluations

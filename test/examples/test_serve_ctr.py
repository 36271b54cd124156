"""examples/serve_ctr.py: the demo writes a version every K steps while a serving shard follows them
and the held-out set is scored through it with each version; the AUC rises from the first version
seen to the last.

Which versions the shard serves depends on how fast the demo trains (it serves the newest when it
looks), so the demo writes 8 versions and the test asks for what holds whichever it skips: two or
more of them, in order, the last one better than the first, and the last one's AUC, which training
fixes (the demo is seeded), that of a trained model."""

import importlib.util
import pathlib


def test_serving_follows_the_demo_and_its_auc_rises(tmp_path, capsys):
    path = pathlib.Path(__file__).parents[2] / "examples" / "serve_ctr.py"
    spec = importlib.util.spec_from_file_location("serve_ctr", path)
    serve_ctr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve_ctr)
    results = serve_ctr.main(["--checkpoint-dir", str(tmp_path), "--train-samples", "200000", "--test-samples",
                              "5000", "--checkpoint-every-steps", "24"])
    versions = [r["version"] for r in results]
    assert len(versions) >= 2 and versions == sorted(versions), versions
    assert versions[-1] == 8, versions
    assert results[-1]["auc"] > results[0]["auc"], results
    assert results[-1]["auc"] > 0.79, results  # 0.80 after 196 steps; an untrained model scores about 0.5
    assert "held-out AUC" in capsys.readouterr().out

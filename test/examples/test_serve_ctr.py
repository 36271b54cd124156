"""examples/serve_ctr.py: the demo writes a version every K steps while a serving shard follows them
and the held-out set is scored through it with each version; the AUC rises from the first version
seen to the last."""

import importlib.util
import pathlib


def test_serving_follows_the_demo_and_its_auc_rises(tmp_path, capsys):
    path = pathlib.Path(__file__).parents[2] / "examples" / "serve_ctr.py"
    spec = importlib.util.spec_from_file_location("serve_ctr", path)
    serve_ctr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve_ctr)
    results = serve_ctr.main(["--checkpoint-dir", str(tmp_path), "--train-samples", "60000", "--test-samples",
                              "5000", "--checkpoint-every-steps", "12"])
    versions = [r["version"] for r in results]
    assert len(versions) >= 2 and versions == sorted(versions), versions
    assert results[-1]["auc"] > results[0]["auc"] + 0.02, results
    assert "held-out AUC" in capsys.readouterr().out

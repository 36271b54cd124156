"""The torch.compile registrations are made when torch imports the parts they extend, whatever
the import order, and importing torch (which autoloads torch_recdev) does not import them."""

import subprocess
import sys
import textwrap


def _run(code, autoload=True):
    env = {"PATH": "/usr/bin:/bin"}
    if not autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


CHECK = """
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import get_custom_backend_pass_for_device, get_device_op_overrides
    assert get_interface_for_device("recdev").device_count() == 1
    assert get_custom_backend_pass_for_device("recdev") is not None
    assert get_device_op_overrides("recdev") is not None
    print("registered")
"""


def test_import_torch_does_not_import_dynamo_or_inductor():
    out = _run("""
        import sys
        import torch
        assert torch.device("recdev").type == "recdev"
        print(sorted(m for m in ("torch._dynamo", "torch._inductor.compile_fx") if m in sys.modules))
    """)
    assert out.strip() == "[]"


def test_registered_when_dynamo_and_inductor_are_imported_after_torch_recdev():
    assert _run("import torch\nimport torch._inductor.compile_fx\n" + textwrap.dedent(CHECK)).strip() == "registered"


def test_registered_when_dynamo_and_inductor_were_imported_before_torch_recdev():
    code = "import torch, torch._dynamo, torch._inductor.compile_fx\nimport torch_recdev\n" + textwrap.dedent(CHECK)
    assert _run(code, autoload=False).strip() == "registered"


def test_every_recdev_op_has_a_fake_kernel_and_the_updates_are_kept_as_side_effects():
    import torch
    import torch_recdev  # noqa: F401
    from torch._library.simple_registry import singleton

    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("recdev::"))
    assert len(names) >= 9, names
    missing = [n for n in names if singleton.find(n).fake_impl.kernel is None]
    assert missing == []
    for name in ("table_embedding_backward", "table_embedding_bag_backward"):
        assert getattr(torch.ops.recdev, name).default in torch.fx.node._side_effectful_functions

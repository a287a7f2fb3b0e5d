#!/usr/bin/env python3
"""Generate holdfast's lock.v1 stubs into src/holdfast/lockv1/ from
crates/holdfast-proto/proto/lock/v1/lock.proto with grpc_tools.protoc.

The stubs are committed (the wheel then needs no protoc at build time);
never edit them by hand. `gen_stubs.py --check` regenerates into a
temporary directory and fails when the committed files differ.

The proto is copied to holdfast/lockv1/lock.proto inside a scratch include
root, so the generated modules import each other as `holdfast.lockv1.*`
(grpc_tools has no relative-import option). The proto package, and so every
message's full name and type URL (type.googleapis.com/lock.v1.ErrorDetail),
is unchanged.
"""

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "crates/holdfast-proto/proto/lock/v1/lock.proto"
OUT = HERE / "src/holdfast/lockv1"
GENERATED = ["lock_pb2.py", "lock_pb2.pyi", "lock_pb2_grpc.py"]


def generate(dest: Path) -> None:
    from grpc_tools import protoc  # grpcio-tools, pinned in requirements-dev.txt

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "include"
        (root / "holdfast/lockv1").mkdir(parents=True)
        shutil.copyfile(PROTO, root / "holdfast/lockv1/lock.proto")
        out = Path(scratch) / "out"
        out.mkdir()
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{root}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                "holdfast/lockv1/lock.proto",
            ]
        )
        if code != 0:
            sys.exit(f"protoc failed ({code}) on {PROTO}")
        dest.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(out / "holdfast/lockv1" / name, dest / name)


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            stale = [n for n in GENERATED if not (OUT / n).exists() or not filecmp.cmp(Path(tmp) / n, OUT / n, shallow=False)]
        if stale:
            print(f"clients/python: {', '.join(stale)} differ from {PROTO.name}; run clients/python/gen_stubs.py and commit", file=sys.stderr)
            return 1
        print("clients/python: stubs match lock.proto")
        return 0
    if sys.argv[1:]:
        print("usage: gen_stubs.py [--check]", file=sys.stderr)
        return 2
    generate(OUT)
    print(f"wrote {', '.join(GENERATED)} to {OUT.relative_to(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

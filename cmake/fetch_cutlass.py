"""Unpacks the CUTLASS/CuTe headers of the nvidia-cutlass wheel into DEST/include.

    python3 cmake/fetch_cutlass.py REQUIREMENT DEST

Downloads the wheel alone (pip download --no-deps: its Python dependencies are not needed for
headers) into DEST/wheel and extracts only cutlass_library/source/include/ (cute/, cutlass/).
Nothing is installed, so the environment's packages stay consistent. Exit status 0 on success;
otherwise pip's last message goes to stderr. Called by cmake/cutlass.cmake.
"""
import glob
import os
import shutil
import subprocess
import sys
import zipfile

PREFIX = "cutlass_library/source/include/"


def main() -> int:
    requirement, dest = sys.argv[1], sys.argv[2]
    wheels = os.path.join(dest, "wheel")
    os.makedirs(wheels, exist_ok=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                          "--disable-pip-version-check", "-q", "-d", wheels, requirement],
                         capture_output=True, text=True)
    found = sorted(glob.glob(os.path.join(wheels, "nvidia_cutlass-*.whl")))
    if pip.returncode != 0 or not found:
        lines = (pip.stderr or pip.stdout or "no wheel downloaded").strip().splitlines()
        print(lines[-1] if lines else "no wheel downloaded", file=sys.stderr)
        return 1
    staging = os.path.join(dest, "include.partial")
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(found[-1]) as wheel:
        for member in wheel.infolist():
            if member.filename.startswith(PREFIX) and not member.is_dir():
                target = os.path.join(staging, member.filename[len(PREFIX):])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with wheel.open(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
    if not os.path.exists(os.path.join(staging, "cute", "tensor.hpp")):
        print(f"{os.path.basename(found[-1])} holds no {PREFIX}cute/tensor.hpp", file=sys.stderr)
        return 1
    final = os.path.join(dest, "include")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)  # complete or absent: an interrupted run leaves no half tree
    return 0


if __name__ == "__main__":
    sys.exit(main())

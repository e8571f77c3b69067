#!/usr/bin/env bash
# The floors check: no file calls or includes up a floor (docs/ARCHITECTURE.md, "The floors").
#   scripts/check_layers.sh [BUILD_DIR]   (default build/; run after a build)
# For every object of a build dir (its compile_commands.json names each source and object), each
# undefined symbol (nm -u) that an object of a higher floor defines; for every source and header
# of the repository, each #include "..." that resolves to a header of a higher floor. Prints one
# line per violation (file, symbol or header, floors) and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "${1:-build}" <<'PY'
import json, os, re, subprocess, sys

# bottom to top; a folder not named here (examples/, benchmarks/, tests/) stands on top
FLOORS = ["include", "common", "backends", "mesh", "layout", "collectives", "spmd", "train",
          "bindings"]
TOP = len(FLOORS)
# where a quoted include is looked for after the including file's own folder (meson.build: inc)
INCLUDE_DIRS = ["include", "common"]


def floor(path):
    parts = os.path.normpath(path).split(os.sep)
    return FLOORS.index(parts[0]) if parts[0] in FLOORS else TOP


def name(f):
    return FLOORS[f] if f < TOP else "top"


def nm(obj, *flags):
    out = subprocess.run(["nm", "-P", *flags, obj], check=True, capture_output=True,
                         text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


build = sys.argv[1]
db = os.path.join(build, "compile_commands.json")
if not os.path.exists(db):
    sys.exit(f"check_layers: {db} not found (build first: scripts/build.sh plain)")
root = os.getcwd()
objects = []  # (source relative to the repository, object path)
for entry in json.load(open(db)):
    src = os.path.relpath(os.path.join(entry["directory"], entry["file"]), root)
    obj = os.path.join(entry["directory"], entry["output"])
    if os.path.exists(obj) and not src.startswith(".."):
        objects.append((src, obj))
if not objects:
    sys.exit(f"check_layers: no object of {db} is built")

definer = {}  # symbol -> (lowest floor defining it, that source)
for src, obj in objects:
    for sym in nm(obj, "--defined-only"):
        if sym not in definer or floor(src) < definer[sym][0]:
            definer[sym] = (floor(src), src)

bad = []
for src, obj in sorted(objects):
    for sym in sorted(nm(obj, "-u")):
        if sym in definer and definer[sym][0] > floor(src):
            f, where = definer[sym]
            bad.append(f"{src}: calls {sym} ({where}): {name(floor(src))} -> {name(f)}")

include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
headers = 0
for top in FLOORS:
    for dirpath, _, files in os.walk(top):
        for fn in sorted(files):
            if not fn.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, fn)
            for inc in include.findall(open(path, errors="replace").read()):
                for base in [dirpath] + INCLUDE_DIRS:
                    target = os.path.normpath(os.path.join(base, inc))
                    if os.path.isfile(target):
                        break
                else:
                    continue  # not in the repository
                headers += 1
                if floor(target) > floor(path):
                    bad.append(f"{path}: includes {target}: "
                               f"{name(floor(path))} -> {name(floor(target))}")

for line in bad:
    print(line)
print(f"check_layers: {len(objects)} objects, {headers} includes: "
      f"{len(bad)} up a floor (floors: {' < '.join(FLOORS)} < top)")
sys.exit(1 if bad else 0)
PY

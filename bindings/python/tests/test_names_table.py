"""The README's table "Where the guides' names live" is exact: every TensorFlow name in its
first column is `dtensor.` plus the same path (a name without `tf.` continues the path of the
name before it, or of one of that path's parents; names in parentheses are members of the name
they follow), except in a row whose last column says the name is not under TensorFlow's
path."""
import inspect
import pathlib
import re

import pytest

import dtensor

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def table_rows():
    text = README.read_text()
    start = text.index("**Where the guides' names live**")
    rows = [line for line in text[start:].splitlines() if line.startswith("| `tf.")]
    assert len(rows) > 15
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def resolve(path):
    """The object at dtensor + path[len("tf"):], or raise AttributeError."""
    obj = dtensor
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def names(cell):
    """(full TensorFlow path, member names) of each name of a cell, in order."""
    out, base = [], None
    # a name, then optionally its members in parentheses
    for m in re.finditer(r"`([^`]+)`(\s*\(([^)]*)\))?", cell):
        token, members = m.group(1), re.findall(r"`([\w.]+)`", m.group(3) or "")
        if "*" in token or " " in token:
            continue
        if token.startswith("tf."):
            full = token
        else:
            full = None
            parents = base.split(".") if base else []
            while parents:  # relative to the base, or to one of its parents
                candidate = ".".join(parents + [token])
                try:
                    resolve(candidate)
                    full = candidate
                    break
                except AttributeError:
                    parents.pop()
            if full is None:
                full = f"{base}.{token}"  # reported as missing below
        out.append((full, members))
        base = full.rsplit(".", 1)[0]
    return out


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: r[0][:40])
def test_every_name_of_the_table_resolves(row):
    first, _, differs = row
    if "not under TensorFlow's path" in differs:
        return
    found = names(first)
    assert found, first
    for full, members in found:
        try:
            obj = resolve(full)
        except AttributeError:
            pytest.fail(f"{full} is in the table but dtensor{full[2:]} does not exist")
        for member in members:  # an attribute, or one its objects set (self.save_counter)
            assert hasattr(obj, member) or (isinstance(obj, type) and re.search(
                rf"self\.{member}\b", inspect.getsource(obj))), \
                f"{full}.{member} is in the table, not in dtensor"

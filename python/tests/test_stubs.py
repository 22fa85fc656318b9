import ast
import pathlib

import dedupwire

STUB = pathlib.Path(__file__).resolve().parents[1] / "dedupwire" / "__init__.pyi"


def stub_tree():
    return ast.parse(STUB.read_text())


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_the_stub_names_every_export():
    top = set()
    for node in stub_tree().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    assert set(dedupwire.__all__) <= top


def test_the_stub_classes_match_the_native_classes():
    for node in stub_tree().body:
        if not isinstance(node, ast.ClassDef) or node.name == "DedupError":
            continue
        stubbed = public(n.name for n in node.body if isinstance(n, ast.FunctionDef))
        native = public(dir(getattr(dedupwire, node.name)))
        assert stubbed == native, node.name

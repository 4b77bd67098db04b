"""Sphinx configuration of rpm's reference: the API from the docstrings (autodoc), the theory
page (MyST) and the tutorials (MyST-NB).

Two tags choose what a build needs:

* ``-t offline``: no network. The names of Python, NumPy, PyTorch and Pyro are left unlinked
  (``nitpick_ignore_regex`` below) while every reference to ``rpm`` must resolve; without the
  tag they are linked to their documentation through intersphinx, which downloads its
  inventories (the network is needed).
* ``-t no_execute``: the tutorials are rendered without outputs; without the tag they are
  executed at their reduced size (``SMOKE_TEST=1``, as tests/test_notebooks.py runs them; set
  ``SMOKE_TEST=0`` for full size), so that the pages show their figures.

tests/test_docs.py builds with both tags; the README's command with ``-t offline`` alone.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import apipages  # noqa: E402

import rpm  # noqa: E402

#: The checkout whose ``rpm`` is imported: the tutorials are taken from its notebooks folder.
ROOT = pathlib.Path(rpm.__file__).resolve().parents[1]
OFFLINE = tags.has("offline")  # noqa: F821 (Sphinx defines ``tags`` in conf.py)
EXECUTE = not tags.has("no_execute")  # noqa: F821

project = "rpm"
author = "rpm contributors"
copyright = "rpm contributors, MIT licence"
release = version = rpm.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "myst_nb",
]
if not OFFLINE:  # the highlighted source of every module: slow, and not what the test checks
    extensions.append("sphinx.ext.viewcode")
    extensions.append("sphinx.ext.intersphinx")

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "apipages.py"]
html_theme = "alabaster"
html_title = f"rpm {release}"
nitpicky = True

# --- autodoc: members follow each module's __all__ --------------------------------------------
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True,
                           "member-order": "bysource"}
autodoc_inherit_docstrings = False  # torch's and Pyro's docstrings are theirs to document
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autosummary_generate = False
autoclass_content = "both"

# --- MyST and MyST-NB ------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_fence_as_directive = ["math"]  # docs/theory.md's ```math blocks, as GitHub shows them
myst_heading_anchors = 3  # docs/theory.md links its own sections (#implicit-prior ...)
nb_execution_mode = "force" if EXECUTE else "off"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# --- intersphinx (full build only) -----------------------------------------------------------
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
    "numpy": ("https://numpy.org/doc/stable", None),
    "torch": ("https://docs.pytorch.org/docs/stable", None),
    "pyro": ("https://docs.pyro.ai/en/stable", None),
}

#: Top-level names of the packages the reference does not document. In the offline build no
#: reference to them is linked; in the full build only those without an inventory above.
EXTERNAL = sorted({*sys.stdlib_module_names, "torch", "pyro", "numpy", "np", "scipy", "sklearn",
                   "matplotlib", "kornia", "tqdm", "nbformat", "typing_extensions", "lightning"})
_WITHOUT_INVENTORY = sorted(set(EXTERNAL) - ({"torch", "pyro", "numpy", "np"}
                                             | set(sys.stdlib_module_names)) | {"np"})
_BUILTINS = sorted(name for name in dir(builtins) if not name.startswith("_"))
nitpick_ignore = [
    ("py:class", "path-like"),  # ``:param path-like path:``: Python's glossary term
    # the private base of the random walks, in RandomWalkEnergy's signature: its public
    # subclasses are documented
    ("py:class", "rpm.priors._explicit._RandomWalkPrior"),
]
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(EXTERNAL if OFFLINE else _WITHOUT_INVENTORY)})(\..*)?"),
    # a private module's objects (rpm.priors._base.declare_prior ...) are not part of the
    # reference: a signature or base class that names one is shown as text
    (r"py:.*", r"rpm(\.\w+)*\._\w+(\..*)?"),
]
if OFFLINE:
    nitpick_ignore_regex.append((r"py:.*", rf"({'|'.join(_BUILTINS)}|None)"))


# --- sources assembled at each build ---------------------------------------------------------
def _assemble_sources(app) -> None:
    """The API pages (docs/api, from ``__all__``) and the tutorials (docs/tutorials, copied from
    notebooks/): both are generated, ignored by git."""
    apipages.write_pages(pathlib.Path(app.srcdir) / "api")
    tutorials = pathlib.Path(app.srcdir) / "tutorials"
    tutorials.mkdir(exist_ok=True)
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for notebook in notebooks:  # their links to ../docs/NAME.md are ../NAME.md from here
        text = notebook.read_text().replace("](../docs/", "](../")
        target = tutorials / notebook.name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    for stale in set(tutorials.glob("*.ipynb")) - {tutorials / n.name for n in notebooks}:
        stale.unlink()
    if EXECUTE:  # the kernel inherits this environment: tests/test_notebooks.py's settings
        os.environ.setdefault("SMOKE_TEST", "1")
        os.environ.pop("MPLBACKEND", None)
        os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")


# --- names as the module's own code sees them ------------------------------------------------
def _lookup(path: str) -> object | None:
    """The object a dotted ``path`` names (a module, then attributes), or None."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except Exception:
            continue
        for part in parts[split:]:
            try:
                obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
            except AttributeError:
                return None
        return obj
    return None


def _documented(env) -> dict[int, str]:
    """``{id(object): documented name}`` of every object in the Python domain (computed once
    per build, after every page was read)."""
    cache = getattr(env, "_rpm_documented", None)
    if cache is None:
        cache = {}
        for name, entry in env.get_domain("py").objects.items():
            if entry.aliased:
                continue
            obj = _lookup(name)
            if obj is not None and not isinstance(obj, int | float | str | bool | tuple | type(None)):
                cache.setdefault(id(obj), name)
        env._rpm_documented = cache
    return cache


def _resolve(app, env, node, contnode):
    """Resolves a reference Sphinx did not find by what the name is in Python, seen from the
    module (and class) whose docstring holds it: ``:class:`RBFEnergy``` in a module that imports
    it, ``rpm.RPM`` re-exported from ``rpm.models``, an inherited ``:meth:``. It links to where
    that object is documented; an object of another package is linked through intersphinx by
    its own name (full build) or left unlinked (offline build)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    # the scopes the name is seen from, innermost first: the documented object's own (autodoc's
    # source line says "docstring of rpm.ops._kalman.kalman_filter" for a function documented
    # as rpm.ops.kalman_filter), then the page's module and class
    scopes = []
    owner = (node.source or "").rpartition("docstring of ")[2] if node.source else ""
    if "docstring of " in (node.source or ""):
        parts = owner.split(".")
        scopes += [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
    module, cls = node.get("py:module"), node.get("py:class")
    if module:
        scopes += [f"{module}.{cls}"] if cls else []
        scopes += [module]
    for scope in list(scopes):  # and the module that defines a class or function in scope
        obj = _lookup(scope)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            scopes += [f"{obj.__module__}.{obj.__qualname__}", obj.__module__]
    candidates = [f"{scope}.{target}" for scope in scopes] + [target]
    domain = env.get_domain("py")

    def link(name):
        new = node.deepcopy()
        new["reftarget"] = name
        new["refspecific"] = False
        return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], name, new,
                                   contnode)

    for candidate in candidates:
        if candidate != target and candidate in domain.objects:  # a documented constant ...
            return link(candidate)
        obj = _lookup(candidate)
        if obj is None:
            continue
        owner_path, _, attribute = candidate.rpartition(".")
        owner = _lookup(owner_path) if owner_path else None
        if inspect.isclass(owner):  # an attribute of a class, maybe inherited: Prior.dim
            for base in owner.__mro__:
                base_name = _documented(env).get(id(base))
                if base_name and f"{base_name}.{attribute}" in domain.objects:
                    return link(f"{base_name}.{attribute}")
        name = _documented(env).get(id(obj))
        if name is not None and name != target:
            found = link(name)
            if found is not None:
                return found
        owner = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
        if name is None and owner.split(".")[0] in EXTERNAL:
            if OFFLINE:
                return contnode
            qualname = getattr(obj, "__qualname__", None)
            if qualname and hasattr(obj, "__module__"):
                from sphinx.ext import intersphinx

                new = node.deepcopy()
                new["reftarget"] = f"{obj.__module__}.{qualname}"
                return intersphinx.missing_reference(app, env, new, contnode)
        return None
    if target in _BUILTINS:
        return contnode if OFFLINE else None
    for namespace in _ANNOTATION_NAMESPACES:  # a bare name in a signature (see above)
        obj = _lookup(f"{namespace}.{target}")
        if obj is not None:
            if OFFLINE:
                return contnode
            from sphinx.ext import intersphinx

            new = node.deepcopy()
            new["reftarget"] = f"{namespace}.{target}"
            return intersphinx.missing_reference(app, env, new, contnode)
    return None


#: Where a bare name of another package in a signature comes from: annotations that are strings
#: (``from __future__ import annotations``) reach Sphinx unevaluated, as ``TorchDistribution``.
_ANNOTATION_NAMESPACES = ("torch", "torch.nn", "torch.distributions", "pyro.distributions",
                          "pyro.nn", "numpy", "pathlib", "collections.abc", "typing")


def _public_bases(app, name, obj, options, bases) -> None:
    """A class's private base (``_BatchChain``) is shown as the public bases it derives from."""
    public = []
    for base in bases:
        public += [b for b in base.__mro__[1:2] if b is not object] \
            if base.__name__.startswith("_") else [base]
    bases[:] = public


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("builder-inited", _assemble_sources)
    app.connect("missing-reference", _resolve, priority=900)  # after intersphinx's
    return {"parallel_read_safe": True}


"""Writes the API pages of the reference, one per public module of ``rpm`` (``rpm.priors``,
``rpm.losses`` ...), from the packages' ``__all__``; docs/conf.py calls :func:`write_pages` at
every build, so the pages follow the code and are never committed.

Each object is documented once, at its *home*: the outermost package below ``rpm`` whose
``__all__`` exports it and which contains the module that defines it (``rpm.priors.RBFEnergy``,
defined in ``rpm.priors._energies``), else the defining module itself. Its other public names
(``rpm.priors._energies.RBFEnergy``, ``rpm.RPM``) are resolved to the home by docs/conf.py.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil

import rpm

#: The top-level modules whose pages the reference has, besides ``rpm`` itself.
TOP = sorted({*rpm._SUBPACKAGES, "cli"})


def public_modules(name: str) -> list[str]:
    """``name`` and its public submodules, recursively (none starting with ``_``), sorted."""
    module = importlib.import_module(name)
    names = [name]
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        if not info.name.startswith("_"):
            names += public_modules(f"{name}.{info.name}")
    return names


def exported(module_name: str) -> list[str]:
    return list(getattr(importlib.import_module(module_name), "__all__", []))


def _identity(obj: object) -> str | None:
    """``module.qualname`` of a class or function, None for data (a constant has no home)."""
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    return None


def homes(modules: list[str]) -> dict[str, str]:
    """``{defining module.qualname: documented full name}`` for the classes and functions that
    ``modules`` export (never at a name that is also a public module's: the module of that name
    is documented instead)."""
    exporters: dict[str, list[str]] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in exported(module_name):
            key = _identity(getattr(module, name, None))
            if key is not None and f"{module_name}.{name}" not in modules:  # not a module's name
                exporters.setdefault(key, []).append(f"{module_name}.{name}")

    def rank(full_name: str, key: str) -> tuple:
        module_name = full_name.rpartition(".")[0]
        encloses = key.startswith(module_name + ".")
        return (not encloses, module_name.count("."), full_name)

    return {key: min(names, key=lambda n, k=key: rank(n, k)) for key, names in exporters.items()}


def _automodule(module_name: str, home: dict[str, str]) -> list[str]:
    module = importlib.import_module(module_name)
    names = exported(module_name)
    elsewhere = sorted(n for n in names
                       if home.get(_identity(getattr(module, n, None)), f"{module_name}.{n}")
                       != f"{module_name}.{n}"
                       or inspect.ismodule(getattr(module, n, None)))
    # a name that the module gives through ``__getattr__`` (imported at first use), and a
    # constant without a ``#:`` comment, are not ones autodoc's :members: finds: each is
    # documented by its own directive
    lazy = [n for n in names if n not in elsewhere
            and (n not in vars(module) or _identity(getattr(module, n)) is None)]
    skip = sorted({*elsewhere, *lazy})
    lines = [f".. automodule:: {module_name}"]
    if len(skip) < len(names):
        lines.append("   :members:")
        if skip:
            lines.append(f"   :exclude-members: {', '.join(skip)}")
    else:
        lines.append("   :no-members:")
    for name in lazy:
        obj = getattr(module, name)
        kind = ("exception" if inspect.isclass(obj) and issubclass(obj, BaseException)
                else "class" if inspect.isclass(obj)
                else "function" if inspect.isfunction(obj) else "data")
        lines += ["", f".. auto{kind}:: {module_name}.{name}"]
    if elsewhere:
        links = ", ".join(f":obj:`~{module_name}.{n}`" for n in elsewhere)
        lines += ["", f"   Also exported here, documented at their home: {links}."]
    return lines


def page(top: str, home: dict[str, str]) -> str:
    modules = public_modules(f"rpm.{top}")
    title = f"``rpm.{top}``"
    lines = [title, "=" * len(title), ""]
    for index, module_name in enumerate(modules):
        if index:
            heading = f"``{module_name}``"
            lines += ["", heading, "-" * len(heading), ""]
        lines += _automodule(module_name, home)
    return "\n".join(lines) + "\n"


def index_page() -> str:
    names = [n for n in rpm.__all__ if n not in rpm._SUBPACKAGES]
    lines = ["API reference", "=============", "",
             ".. automodule:: rpm", "   :no-members:", "",
             "The names ``import rpm`` gives (``rpm.__all__``), each documented in its module:", "",
             ".. autosummary::", "   :nosignatures:", ""]
    lines += [f"   {n}" for n in names]
    lines += ["", "The modules:", "", ".. toctree::", "   :maxdepth: 1", ""]
    lines += [f"   rpm.{top}" for top in TOP]
    return "\n".join(lines) + "\n"


def write_pages(folder: pathlib.Path) -> list[pathlib.Path]:
    """Writes ``index.rst`` and ``rpm.NAME.rst`` into ``folder``; rewrites a page only when its
    text changed, so that Sphinx rebuilds only what did."""
    folder.mkdir(parents=True, exist_ok=True)
    modules = [m for top in TOP for m in public_modules(f"rpm.{top}")]
    home = homes(modules)
    pages = {"index.rst": index_page(), **{f"rpm.{top}.rst": page(top, home) for top in TOP}}
    written = []
    for name, text in pages.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    for stale in set(folder.glob("*.rst")) - set(written):
        stale.unlink()
    return written

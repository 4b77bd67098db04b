"""The public surface of the core: a name is public when a package-level ``__all__`` exports it;
every module inside a core package is private (a leading underscore), no exported name hides a
submodule, every exported name resolves and has a docstring, and the surface stays small."""

import importlib
import inspect
import pkgutil

import pytest

#: The core packages (and the core's public top-level modules).
CORE = ["rpm", "rpm.ops", "rpm.distributions", "rpm.marginals", "rpm.priors", "rpm.models",
        "rpm.inference", "rpm.mi", "rpm.losses", "rpm.nn"]
#: The most public names the core's packages may export together.
MAX_PUBLIC_NAMES = 120


def exported(name: str) -> list[str]:
    return list(importlib.import_module(name).__all__)


def test_the_core_exports_at_most_the_budget_of_names():
    total = sum(len(exported(name)) for name in CORE)
    assert total <= MAX_PUBLIC_NAMES, f"the core exports {total} names"


@pytest.mark.parametrize("package", [p for p in CORE if p not in ("rpm", "rpm.losses", "rpm.nn")])
def test_every_module_inside_a_core_package_is_private(package):
    module = importlib.import_module(package)
    public = [info.name for info in pkgutil.iter_modules(module.__path__)
              if not info.name.startswith("_")]
    assert public == [], f"{package} has public submodules {public}: prefix them with '_'"


@pytest.mark.parametrize("package", CORE)
def test_exported_names_resolve_are_documented_and_hide_no_submodule(package):
    module = importlib.import_module(package)
    names = exported(package)
    assert len(set(names)) == len(names), "a name is exported twice"
    submodules = {info.name for info in pkgutil.iter_modules(getattr(module, "__path__", []))}
    for name in names:
        obj = getattr(module, name)
        if inspect.ismodule(obj):  # a subpackage exported as itself
            assert obj.__name__ == f"{package}.{name}"
            continue
        assert name not in submodules, f"{package}.{name} hides the submodule of that name"
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), f"{package}.{name} has no docstring"


def test_the_internal_helpers_are_not_public():
    """The names a release review found public that users should not build on."""
    import rpm.inference
    import rpm.models
    import rpm.nn
    import rpm.ops
    import rpm.priors

    assert not {"elbo"} & set(rpm.inference.__all__)
    assert not {"structure_version", "registration_scope", "unique_name", "check_name"} \
        & set(rpm.nn.__all__)
    assert not hasattr(rpm.nn, "structure_version")
    for package in (rpm.models, rpm.priors, rpm.ops):
        assert not {"checked_batches", "energy_range", "dispatch"} & set(dir(package)) - {
            n for n in dir(package) if n.startswith("_")}
    # `import rpm.inference.elbo` was a function shadowing its module; the module is private now
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rpm.inference.elbo")
    assert callable(rpm.ops.lp_distances)  # the function, not a module of that name

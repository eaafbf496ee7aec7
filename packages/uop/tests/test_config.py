"""Runtime configuration: `getenv` conversions, `ContextVar` and `Context` overrides."""

from __future__ import annotations

import pytest

from lazygrad_uop.config import BEAM, DEBUG, Context, ContextVar, getenv

KEY = "LAZYGRAD_TEST_CONFIG_VALUE"


@pytest.mark.parametrize(
    ("raw", "default", "expected"),
    [
        ("3", 0, 3),
        ("-12", 7, -12),
        (" 4 ", 0, 4),  # int() accepts surrounding blanks
        ("2.5", 0.0, 2.5),
        ("1e3", 1.0, 1000.0),
        ("hello", "", "hello"),
        ("", "x", ""),  # set but empty is a value for a string setting
        ("1", False, True),
        ("0", True, False),
        ("", True, False),
        ("false", True, False),
        ("No", True, False),
        ("OFF", True, False),
        ("yes", False, True),
        ("2", False, True),
    ],
)
def test_getenv_converts_to_the_default_type(monkeypatch: pytest.MonkeyPatch, raw, default, expected) -> None:
    monkeypatch.setenv(KEY, raw)
    got = getenv(KEY, default)
    assert got == expected and type(got) is type(expected)


def test_getenv_unset_returns_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY, raising=False)
    sentinel = object()
    assert getenv(KEY, sentinel) is sentinel
    assert getenv(KEY) == 0


@pytest.mark.parametrize(("raw", "default"), [("abc", 0), ("1.5", 0), ("", 0), ("one", 1.0)])
def test_getenv_bad_number_names_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str, default) -> None:
    monkeypatch.setenv(KEY, raw)
    with pytest.raises(ValueError, match=KEY) as e:
        getenv(KEY, default)
    assert type(default).__name__ in str(e.value)


def test_contextvar_reads_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAZYGRAD_TEST_CV_ENV", "5")
    cv = ContextVar("LAZYGRAD_TEST_CV_ENV", 0)
    monkeypatch.setenv("LAZYGRAD_TEST_CV_ENV", "9")
    assert cv.value == 5
    assert cv >= 5 and cv > 4 and cv < 6 and cv <= 5 and bool(cv)


def test_contextvar_defined_twice_raises() -> None:
    with pytest.raises(ValueError, match="twice"):
        ContextVar("DEBUG", 0)


def test_context_overrides_and_restores() -> None:
    before_debug, before_beam = DEBUG.value, BEAM.value
    with Context(DEBUG=before_debug + 4, BEAM=7):
        assert DEBUG.value == before_debug + 4 and BEAM.value == 7
        with Context(DEBUG=1):
            assert DEBUG.value == 1 and BEAM.value == 7
        assert DEBUG.value == before_debug + 4
    assert DEBUG.value == before_debug and BEAM.value == before_beam


def test_context_restores_when_body_raises() -> None:
    before = DEBUG.value
    with pytest.raises(ZeroDivisionError), Context(DEBUG=before + 3):
        assert DEBUG.value == before + 3
        _ = 1 // 0
    assert DEBUG.value == before


def test_context_unknown_setting_raises_keyerror_listing_known_ones() -> None:
    before = DEBUG.value
    with pytest.raises(KeyError) as e, Context(DEBUG=before + 1, NOT_A_SETTING=1):
        pass
    msg = str(e.value)
    assert "NOT_A_SETTING" in msg and "DEBUG" in msg and "BEAM" in msg
    # nothing was changed by the rejected override
    assert DEBUG.value == before
    with pytest.raises(KeyError, match="known settings"):
        ContextVar.get("ALSO_NOT_A_SETTING")

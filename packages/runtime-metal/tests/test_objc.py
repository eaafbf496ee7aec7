"""The Objective-C bridge: message signatures are checked anywhere; messages are sent only on macOS."""

from __future__ import annotations

import ctypes
import sys

import pytest

from lazygrad_metal import objc

macos = pytest.mark.skipif(sys.platform != "darwin", reason="the Objective-C runtime exists only on macOS")


def test_a_message_must_type_every_argument() -> None:
    with pytest.raises(ValueError, match="takes 2 arguments, 1 typed"):
        objc.Message("setBuffer:offset:", None, objc.id_t)


def test_messages_to_nil_raise() -> None:
    with pytest.raises(objc.ObjCError, match="length sent to nil"):
        objc.Message("length", objc.NSUInteger)(0)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the error off macOS")
def test_off_macos_the_runtime_is_unavailable_with_a_reason() -> None:
    with pytest.raises(objc.ObjCError, match=f"only on macOS, this is {sys.platform}"):
        objc.libobjc()


@macos
def test_nsstring_roundtrip_and_ownership() -> None:
    text = "kernel void E_4(ünïcode)"
    s = objc.nsstring(text)
    try:
        assert objc.to_str(s) == text
        assert objc.responds_to(s, "UTF8String") and not objc.responds_to(s, "noSuchMethodHere:")
        assert objc.Message("length", objc.NSUInteger)(s) == len(text)
    finally:
        objc.release(s)


@macos
def test_autorelease_pool_and_arrays() -> None:
    objc.framework("Foundation")
    s = objc.nsstring("x")
    with objc.autorelease_pool():
        array = objc.Message("arrayWithObject:", objc.id_t, objc.id_t)(objc.objc_class("NSArray"), s)
        (item,) = objc.nsarray_items(array)
        assert objc.to_str(item) == "x"
    objc.release(s)
    assert objc.to_str(None) == "" and objc.error_text(None) == "unknown error"


@macos
def test_unknown_classes_raise() -> None:
    objc.libobjc()
    with pytest.raises(objc.ObjCError, match="no Objective-C class NoSuchClassAnywhere"):
        objc.objc_class("NoSuchClassAnywhere")
    assert ctypes.sizeof(objc.NSUInteger) == 8

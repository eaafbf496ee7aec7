"""The Objective-C runtime through ctypes: just enough of it to drive Metal without a compiled extension.

An Objective-C object is a pointer (an `int` here, 0 for nil). A method is called by sending a message with
`objc_msgSend`, which must be called through a function pointer of the method's exact C type: every message this
package sends is declared once as a `Message` (selector, return type, argument types), and calling it casts
`objc_msgSend` to that type. Nothing here returns a struct by value, so `objc_msgSend_stret` is never needed.

Ownership follows Cocoa's rule: objects from methods named alloc/new/copy (and functions with Create/Copy) are
owned and must be `release`d; others are autoreleased, so calls that make them run inside `autorelease_pool()`.

Nothing is loaded until first used, so this module imports anywhere; using it off macOS raises `ObjCError`.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

LIBOBJC = "/usr/lib/libobjc.A.dylib"
FRAMEWORKS = "/System/Library/Frameworks"

id_t = ctypes.c_void_p
NSUInteger = ctypes.c_ulong
BOOL = ctypes.c_bool


class ObjCError(RuntimeError):
    """The Objective-C runtime or a framework is unavailable, or a message went to nil."""


@cache
def libobjc() -> ctypes.CDLL:
    """The Objective-C runtime library, loaded once."""
    if sys.platform != "darwin":
        raise ObjCError(f"the Objective-C runtime exists only on macOS, this is {sys.platform}")
    try:
        lib = ctypes.CDLL(LIBOBJC)
    except OSError as exc:
        raise ObjCError(f"can't load the Objective-C runtime ({LIBOBJC}): {exc}") from None
    lib.objc_getClass.restype, lib.objc_getClass.argtypes = id_t, [ctypes.c_char_p]
    lib.sel_registerName.restype, lib.sel_registerName.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    lib.objc_autoreleasePoolPush.restype, lib.objc_autoreleasePoolPush.argtypes = ctypes.c_void_p, []
    lib.objc_autoreleasePoolPop.restype, lib.objc_autoreleasePoolPop.argtypes = None, [ctypes.c_void_p]
    return lib


@cache
def framework(name: str) -> ctypes.CDLL:
    """A system framework ("Metal", "Foundation"), loaded once; loading registers its Objective-C classes."""
    libobjc()
    path = f"{FRAMEWORKS}/{name}.framework/{name}"
    try:
        return ctypes.CDLL(path)
    except OSError as exc:
        raise ObjCError(f"can't load the {name} framework ({path}): {exc}") from None


@cache
def objc_class(name: str) -> int:
    """The class object named `name` (e.g. "NSString"); its framework must be loaded."""
    cls = libobjc().objc_getClass(name.encode())
    if not cls:
        raise ObjCError(f"no Objective-C class {name}: is its framework loaded?")
    return cls


@cache
def _selector(name: str) -> int:
    return libobjc().sel_registerName(name.encode())


@cache
def _msgsend_address() -> int:
    return ctypes.cast(libobjc().objc_msgSend, ctypes.c_void_p).value or 0


class Message:
    """A method's selector and C signature: `Message("newBufferWithLength:options:", id_t, NSUInteger, NSUInteger)`.
    Calling it with a receiver and the arguments sends the message and returns what the method returns."""

    def __init__(self, selector: str, restype: Any, *argtypes: Any) -> None:
        if selector.count(":") != len(argtypes):
            raise ValueError(f"selector {selector} takes {selector.count(':')} arguments, {len(argtypes)} typed")
        self.selector, self.restype, self.argtypes = selector, restype, argtypes
        self._fn: Any = None

    def __call__(self, receiver: int | None, *args: Any) -> Any:
        if not receiver:
            raise ObjCError(f"message {self.selector} sent to nil")
        if self._fn is None:
            prototype = ctypes.CFUNCTYPE(self.restype, id_t, ctypes.c_void_p, *self.argtypes)
            self._fn = prototype(_msgsend_address())
        return self._fn(receiver, _selector(self.selector), *args)


# *** NSObject, NSString, NSError, NSArray ***

ALLOC = Message("alloc", id_t)
INIT = Message("init", id_t)
NEW = Message("new", id_t)
RETAIN = Message("retain", id_t)
RELEASE = Message("release", None)
RESPONDS_TO = Message("respondsToSelector:", BOOL, ctypes.c_void_p)
INIT_WITH_UTF8 = Message("initWithUTF8String:", id_t, ctypes.c_char_p)
UTF8_STRING = Message("UTF8String", ctypes.c_char_p)
LOCALIZED_DESCRIPTION = Message("localizedDescription", id_t)
COUNT = Message("count", NSUInteger)
OBJECT_AT_INDEX = Message("objectAtIndex:", id_t, NSUInteger)


def new_object(class_name: str) -> int:
    """`[[class_name alloc] init]`: an owned instance, to be released."""
    return INIT(ALLOC(objc_class(class_name)))


def release(obj: int | None) -> None:
    """Give up ownership of `obj` (nothing for nil)."""
    if obj:
        RELEASE(obj)


def responds_to(obj: int, selector: str) -> bool:
    """Whether `obj` implements `selector` (methods that newer OS versions added)."""
    return bool(RESPONDS_TO(obj, _selector(selector)))


def nsstring(text: str) -> int:
    """An owned NSString holding `text`, to be released."""
    framework("Foundation")
    return INIT_WITH_UTF8(ALLOC(objc_class("NSString")), text.encode())


def to_str(nsstr: int | None) -> str:
    """The text of an NSString ("" for nil)."""
    if not nsstr:
        return ""
    raw = UTF8_STRING(nsstr)
    return raw.decode("utf-8", errors="replace") if raw else ""


def error_text(error: int | None) -> str:
    """An NSError's localizedDescription ("unknown error" for nil)."""
    return to_str(LOCALIZED_DESCRIPTION(error)) if error else "unknown error"


def nsarray_items(array: int) -> list[int]:
    """The objects of an NSArray, in order."""
    return [OBJECT_AT_INDEX(array, i) for i in range(COUNT(array))]


@contextmanager
def autorelease_pool() -> Iterator[None]:
    """Objects autoreleased inside the block are released when it ends (retain those you keep)."""
    lib = libobjc()
    pool = lib.objc_autoreleasePoolPush()
    try:
        yield
    finally:
        lib.objc_autoreleasePoolPop(pool)

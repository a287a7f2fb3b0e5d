"""The fencing token: a capability that never prints."""

from __future__ import annotations

REDACTED = "<redacted token>"
_REVISION_BITS = 48
_MAX_EPOCH = (1 << 15) - 1
_MAX_REVISION = (1 << _REVISION_BITS) - 1


class Token:
    """A fencing token, ``epoch << 48 | revision``: whoever presents it can
    write to a fenced resource, so it never prints. ``repr``, ``str``,
    ``format`` with any spec, logging and pickling-free copies all show
    ``<redacted token>``; :meth:`expose` is the one way to read it. Zero for
    an unprotected grant, which a fenced resource refuses."""

    __slots__ = ("__value",)

    def __init__(self, value: int) -> None:
        # Name-mangled: vars()/__dict__ dumps have nothing to show.
        self.__value = value

    @classmethod
    def _from_wire(cls, value: int) -> Token:
        """A token received from the arbiter, refusing values no arbiter could
        have minted (epoch 1..32767, revision 1..2**48-1)."""
        from .errors import ConfigError

        epoch, rev = value >> _REVISION_BITS, value & _MAX_REVISION
        if epoch == 0 or epoch > _MAX_EPOCH:
            raise ConfigError(f"the arbiter returned a malformed token (epoch {epoch} is out of range 1..={_MAX_EPOCH})")
        if rev == 0:
            raise ConfigError("the arbiter returned a malformed token (revision 0)")
        return cls(value)

    def expose(self) -> int:
        """The packed value, for the wire and the resource's fence column.
        Never log or print what it returns."""
        return self.__value

    @property
    def epoch(self) -> int:
        """The epoch the grant was made in (diagnostics only)."""
        return self.__value >> _REVISION_BITS

    @property
    def revision(self) -> int:
        """The etcd revision of the grant (diagnostics only)."""
        return self.__value & _MAX_REVISION

    @property
    def unprotected(self) -> bool:
        return self.__value == 0

    def __repr__(self) -> str:
        return f"Token({REDACTED})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, spec: str) -> str:
        # Every spec, numeric ones included ({:d}, {:x}): never the value.
        return REDACTED

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Token) and other.__value == self.__value

    def __hash__(self) -> int:
        return hash((Token, self.__value))

    def __reduce__(self):  # pickle/copy would carry the value out silently
        raise TypeError("a holdfast Token cannot be pickled; pass token.expose() explicitly")

    def __copy__(self) -> Token:
        return self

    def __deepcopy__(self, memo: dict) -> Token:
        return self

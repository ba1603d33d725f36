"""TorchRL's phrases inside our messages: the one mechanism, at the bottom layer so every package can use it.

Code written for TorchRL matches some of its error and warning texts with ``re.search`` (``pytest.raises(match=)``,
``except ... if "..." in str(err)``). Our messages keep their own wording, which says what was received and what
to do, and contain TorchRL's phrase verbatim. Each situation is one :class:`TorchRLPhrase` constant, defined in the
module that raises it, next to the code (``test/compat/test_torchrl_phrases.py`` collects them module by module).

This module imports nothing from torchrl, so that every layer can use it.
"""

from __future__ import annotations

import warnings

__all__ = ["TorchRLPhrase"]


class TorchRLPhrase:
    """One situation in which TorchRL's message carries a phrase user code matches.

    Args:
        type: the exception (or warning) class raised; TorchRL's type or a subclass of it.
        phrase: the regular expression TorchRL's message matches (``re.search``), as TorchRL's tests write it.
        message: our message, a :meth:`str.format` template that contains ``phrase``; its fields are the situation's
            details (what was received), passed to :meth:`error` / :meth:`warn`.

    Examples:
        >>> NEGATIVE_ALPHA = TorchRLPhrase(
        ...     ValueError, "alpha must be greater or equal", "alpha must be greater or equal to 0, got {alpha}."
        ... )
        >>> err = NEGATIVE_ALPHA.error(alpha=-1.0)
        >>> type(err).__name__, str(err)
        ('ValueError', 'alpha must be greater or equal to 0, got -1.0.')
    """

    __slots__ = ("type", "phrase", "message")

    def __init__(self, type: type, phrase: str, message: str):
        self.type, self.phrase, self.message = type, phrase, message

    def format(self, **fields) -> str:
        """The message with ``fields`` filled in."""
        return self.message.format(**fields)

    def error(self, **fields) -> BaseException:
        """The exception to raise, its message filled with ``fields`` (``raise PHRASE.error(...)``)."""
        return self.type(self.format(**fields))

    def warn(self, *, stacklevel: int = 3, **fields) -> None:
        """Warn with this situation's warning class, its message filled with ``fields``."""
        warnings.warn(self.format(**fields), self.type, stacklevel=stacklevel)

    def __repr__(self) -> str:
        return f"TorchRLPhrase({self.type.__name__}, {self.phrase!r})"

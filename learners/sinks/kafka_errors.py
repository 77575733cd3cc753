"""How the Kafka sink's modules report a failed step."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


class StepFailed(Exception):
    """A step of open/deliver/flush/recover failed; the message is the one-line reason."""


def reason(exc: BaseException) -> str:
    """One line for any Kafka (or other) error."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        text = exc.args[0].str()
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())

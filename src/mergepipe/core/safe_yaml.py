"""YAML from users, bounded: no aliases (no expansion bombs), dates as text, integers of sane length."""

from __future__ import annotations

from typing import Any

import yaml

MAX_INT_DIGITS = 40  # a weight, a seed or a count; 4300-digit integers only cost CPU
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader without aliases, without implicit timestamps (a date stays the string
    it was written as) and with integers of at most MAX_INT_DIGITS digits."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not accepted in a config; write the value out",
                event.start_mark)
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits (at most {MAX_INT_DIGITS})",
                node.start_mark)
        return int(super().construct_yaml_int(node))


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
def _as_text(loader: BoundedLoader, node: Any) -> str:
    return str(loader.construct_scalar(node))


BoundedLoader.add_constructor(_TIMESTAMP, _as_text)  # an explicit !!timestamp: text too
BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def load(text: str | bytes) -> Any:
    """One YAML document (yaml.YAMLError on anything refused, with a mark where it is)."""
    return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass

"""comfysup.records and comfysup.config.sections: a record (a config section among them) is frozen, compared,
hashed and copied by value, and its keys (with their types, defaults and checks) are read back in their order.

No ``from __future__ import annotations`` here: a section's annotations are types, as in comfysup.config.schema.
"""

import pickle
from typing import ClassVar

import pytest

from comfysup.config import QueueConfig, ServerConfig
from comfysup.config.sections import Section, setting
from comfysup.records import Record, fields, new, replace, values


def test_keys_are_read_in_order_with_their_types_defaults_and_checks() -> None:
    def positive(value: float) -> str | None:
        return None if value > 0 else "must be more than 0"

    class Sample(Section):
        name: str
        weight: float = setting(1.0, positive)
        tags: tuple[str, ...] = ()
        RULES: ClassVar[tuple[str, ...]] = ("not a key",)

    assert [(k.name, k.type, k.checks) for k in fields(Sample)] == [
        ("name", str, ()), ("weight", float, (positive,)), ("tags", tuple[str, ...], ())]
    assert Sample.weight == 1.0  # the class attribute is the default, not what ``setting`` left
    assert values(Sample("a")) == {"name": "a", "weight": 1.0, "tags": ()}
    with pytest.raises(TypeError, match="needs 'name'"):
        Sample()
    with pytest.raises(TypeError, match="'RULES'"):
        Sample(name="a", RULES=())
    with pytest.raises(TypeError, match="'name'"):
        Sample("a", name="b")
    with pytest.raises(TypeError, match="read as types"):
        type("Postponed", (Section,), {"__annotations__": {"name": "str"}})


def test_a_key_with_a_factory_gets_a_fresh_value_in_each_record() -> None:
    class Job(Record):
        id: str
        meta: dict[str, str] = new(dict)

    first, second = Job("a"), Job("b")
    assert first.meta == {} and first.meta is not second.meta and not hasattr(Job, "meta")
    assert replace(first, meta={"k": "v"}).meta == {"k": "v"} and first.meta == {}


def test_a_section_is_frozen_and_compared_hashed_copied_and_pickled_by_value() -> None:
    queue = QueueConfig(path="q.db")
    with pytest.raises(AttributeError, match="frozen"):
        queue.path = "other.db"  # type: ignore[misc]
    assert queue == QueueConfig("q.db") and hash(queue) == hash(QueueConfig("q.db"))
    assert queue != QueueConfig() and queue != ServerConfig("q.db", "http://x")
    changed = replace(queue, busy_timeout_seconds=5.0)
    assert (changed.path, changed.busy_timeout_seconds, queue.busy_timeout_seconds) == ("q.db", 5.0, 30.0)
    assert pickle.loads(pickle.dumps(changed)) == changed
    assert repr(ServerConfig("a", "http://x")) == "ServerConfig(name='a', url='http://x', output_dir='')"


def test_a_record_of_a_module_with_postponed_annotations_reads_its_keys_and_class_attributes() -> None:
    postponed = type("Postponed", (Record,), {"__annotations__": {"LIMIT": "ClassVar[int]", "name": "str",
                                                                  "size": "int"}, "LIMIT": 3, "size": 0})
    assert [(k.name, k.type) for k in fields(postponed)] == [("name", "str"), ("size", "int")]
    assert postponed.LIMIT == 3 and values(postponed("a")) == {"name": "a", "size": 0}

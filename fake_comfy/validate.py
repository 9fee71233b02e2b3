"""POST /prompt validation, ported from ComfyUI 0.3.64's execution.validate_prompt / validate_inputs.

The structure follows the original on purpose: which node an error is filed under, which errors are
dropped and which exceptions escape (and become aiohttp's 500) all fall out of that structure, and
the recordings (tests/recorded) pin them (e.g. a missing link is filed under the node that has
it, described by its downstream input; a cycle gives node_errors {}).
"""

from __future__ import annotations

from typing import Any

from .nodes import Catalogue, data
from .uploads import LOADERS, loaded_path

Validation = tuple[bool, dict[str, Any] | None, list[str], dict[str, Any]]
NodeResult = tuple[bool, list[dict[str, Any]], str]


def _error(kind: str, message: str, details: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": extra or {}}


def validate_prompt(prompt: Any, partial_targets: list[str] | None, catalogue: Catalogue) -> Validation:
    """(valid, error, good_outputs, node_errors) exactly as ComfyUI returns them."""
    outputs, refused = _outputs(prompt, partial_targets, catalogue)
    if refused is not None:
        return refused
    good: list[str] = []
    failed: list[tuple[str, list[dict[str, Any]]]] = []
    node_errors: dict[str, Any] = {}
    validated: dict[str, NodeResult] = {}
    for o in outputs:
        valid, reasons = _validate_output(o, prompt, catalogue, validated)
        if valid:
            good.append(o)
            continue
        failed.append((o, reasons))
        _file_errors(node_errors, validated, prompt, o)
    if not good:
        details = "\n".join(f"{e['message']}: {e['details']}" for _, errors in failed for e in errors)
        error = _error("prompt_outputs_failed_validation", "Prompt outputs failed validation", details)
        return False, error, [], node_errors
    return True, None, good, node_errors


def _outputs(prompt: Any, partial_targets: list[str] | None,
             catalogue: Catalogue) -> tuple[list[str], Validation | None]:
    """The prompt's output nodes (those of ``partial_targets`` when given), or the refusal of a prompt with a node
    that has no class_type or one that does not exist, or with no output."""
    outputs: list[str] = []
    for x in prompt:
        if "class_type" not in prompt[x]:
            details = f"Node ID '#{x}'"
            message = "Cannot execute because a node is missing the class_type property."
            return [], (False, _error("invalid_prompt", message, details), [], {})
        class_type = prompt[x]["class_type"]
        node = catalogue.get(class_type)
        if node is None:
            message = f"Cannot execute because node {class_type} does not exist."
            return [], (False, _error("invalid_prompt", message, f"Node ID '#{x}'"), [], {})
        if node.output_node and (partial_targets is None or x in partial_targets):
            outputs.append(x)
    if not outputs:
        return [], (False, _error("prompt_no_outputs", "Prompt has no outputs", ""), [], {})
    return outputs, None


def _validate_output(o: str, prompt: Any, catalogue: Catalogue,
                     validated: dict[str, NodeResult]) -> tuple[bool, list[dict[str, Any]]]:
    """Whether output ``o`` and the nodes it depends on are valid, and why not; an exception while validating is
    filed under ``o`` as ComfyUI files it."""
    try:
        valid, reasons, _ = _Validator(prompt, catalogue, validated).node(o)
    except Exception as ex:
        extra = {
            "exception_type": _type_name(ex),
            "traceback": data("errors.json")["inner_validation_traceback"],
        }
        reasons = [
            _error("exception_during_validation", "Exception when validating node", str(ex), extra)
        ]
        validated[o] = (False, reasons, o)
        return False, reasons
    return valid, reasons


def _file_errors(node_errors: dict[str, Any], validated: dict[str, NodeResult], prompt: Any, o: str) -> None:
    """Every node validated so far that failed with reasons, in ``node_errors`` with ``o`` among its dependent
    outputs."""
    for node_id, (ok, node_reasons, _) in validated.items():
        if ok is not True and node_reasons:
            entry = node_errors.setdefault(
                node_id,
                {
                    "errors": node_reasons,
                    "dependent_outputs": [],
                    "class_type": prompt[node_id]["class_type"],
                },
            )
            entry["dependent_outputs"].append(o)


def scripted_invalid(prompt: dict[str, Any], catalogue: Catalogue) -> Validation:
    """The "invalid" script word: the recorded out-of-range error, filed under the prompt's first node."""
    outputs = [x for x in prompt if (node := catalogue.get(prompt[x].get("class_type"))) and node.output_node]
    first = next(iter(prompt))
    reason = dict(data("errors.json")["scripted_invalid_error"])
    error = _error("prompt_outputs_failed_validation", "Prompt outputs failed validation", "")
    node_errors = {
        first: {
            "errors": [reason],
            "dependent_outputs": outputs or [first],
            "class_type": prompt[first].get("class_type"),
        }
    }
    return False, error, [], node_errors


def _type_name(ex: BaseException) -> str:
    """ComfyUI's full_type_name: builtins are bare ("KeyError"), others are module-qualified."""
    module = type(ex).__module__
    name = type(ex).__qualname__
    return name if module == "builtins" else f"{module}.{name}"


def _combo_options(input_type: Any, extra: dict[str, Any]) -> list[Any] | None:
    """A combo input's choices: the list itself, or a v3 node's ["COMBO", {"options": [...]}]; None otherwise."""
    if isinstance(input_type, list):
        return input_type
    if input_type == "COMBO":
        options = extra.get("options", [])
        return options if isinstance(options, list) else []
    return None


def _accepts(received: str, expected: Any) -> bool:
    """ComfyUI's validate_node_input: equal types, "*" or overlapping comma-separated unions."""
    if not isinstance(expected, str):
        return False
    if received == expected or "*" in (received, expected):
        return True
    return bool(set(received.split(",")) & set(expected.split(",")))


class _Validator:
    """validate_inputs for one output, sharing `validated` across outputs as ComfyUI does."""

    def __init__(
        self, prompt: dict[str, Any], catalogue: Catalogue, validated: dict[str, NodeResult]
    ) -> None:
        self.prompt = prompt
        self.catalogue = catalogue
        self.validated = validated
        self.active: set[str] = set()

    def node(self, unique_id: str) -> NodeResult:
        """Validate one node and, through its links, its ancestors; the result lands in `validated`."""
        if unique_id in self.validated:
            return self.validated[unique_id]
        node = self.catalogue.get(self.prompt[unique_id]["class_type"])
        assert node is not None  # every class was looked up before
        inputs = self.prompt[unique_id]["inputs"]
        self.active.add(unique_id)
        try:
            errors: list[dict[str, Any]] = []
            valid = True
            if node.passthrough:
                for value in inputs.values():
                    if isinstance(value, list) and len(value) == 2:
                        valid = self._link(value, None, None, errors) and valid
            else:
                for name, (category, spec) in node.input_specs().items():
                    if name == "image" and node.name in LOADERS and isinstance(inputs.get(name), str):
                        self._loaded_file(inputs[name], errors)  # VALIDATE_INPUTS: the file exists, no list
                        continue
                    valid = self._input(inputs, name, category, spec, errors) and valid
        finally:
            self.active.discard(unique_id)
        result = (not errors and valid, errors, unique_id)
        self.validated[unique_id] = result
        return result

    def _loaded_file(self, name: str, errors: list[dict[str, Any]]) -> None:
        """LoadImage/LoadImageMask's VALIDATE_INPUTS: only whether the annotated path exists."""
        options = self.catalogue._options
        folder = options.input_dir if options is not None else self.catalogue._input_dir
        kinds = options.directory_for_type if options is not None else (lambda kind: folder)
        if loaded_path(name, folder, kinds) is None:
            errors.append(_error("custom_validation_failed", "Custom validation failed for node",
                                 f"image - Invalid image file: {name}", {"input_name": "image"}))

    def _input(
        self, inputs: dict[str, Any], name: str, category: str, spec: list[Any], errors: list[dict[str, Any]]
    ) -> bool:
        """Check one declared input; False when it depends on an invalid node (no error of its own)."""
        input_type = spec[0]
        extra = spec[1] if len(spec) > 1 else {}
        if name not in inputs:
            if category == "required":
                errors.append(
                    _error("required_input_missing", "Required input is missing", name, {"input_name": name})
                )
            return True
        value = inputs[name]
        info = [input_type, extra]
        if isinstance(value, list):
            if len(value) != 2:
                message = "Bad linked input, must be a length-2 list of [node_id, slot_index]"
                errors.append(
                    _error(
                        "bad_linked_input",
                        message,
                        name,
                        {"input_name": name, "input_config": info, "received_value": value},
                    )
                )
                return True
            return self._link(value, name, info, errors)
        return self._value(inputs, name, value, info, errors)

    def _link(
        self, value: list[Any], name: str | None, info: list[Any] | None, errors: list[dict[str, Any]]
    ) -> bool:
        o_id = value[0]
        source = self.catalogue.get(
            self.prompt[o_id]["class_type"]
        )  # KeyError for a missing node, as upstream
        assert source is not None
        if name is not None and info is not None and not source.passthrough:
            received = source.return_types[value[1]]
            if not _accepts(received, info[0]):
                details = f"{name}, received_type({received}) mismatch input_type({info[0]})"
                extra = {
                    "input_name": name,
                    "input_config": info,
                    "received_type": received,
                    "linked_node": value,
                }
                message = "Return type mismatch between linked nodes"
                errors.append(_error("return_type_mismatch", message, details, extra))
                return True
        if o_id in self.active:  # a cycle: upstream recursed until it failed, leaving no reasons behind
            return False
        try:
            if o_id not in self.validated and not self.node(o_id)[0]:
                return False
        except Exception as ex:
            extra = {
                "input_name": name,
                "input_config": info,
                "exception_message": str(ex),
                "exception_type": _type_name(ex),
                "traceback": data("errors.json")["inner_validation_traceback"],
                "linked_node": value,
            }
            message = "Exception when validating inner node"
            reasons = [_error("exception_during_inner_validation", message, str(ex), extra)]
            self.validated[o_id] = (False, reasons, o_id)
            return False
        return True

    @staticmethod
    def _value(
        inputs: dict[str, Any], name: str, value: Any, info: list[Any], errors: list[dict[str, Any]]
    ) -> bool:
        input_type, extra = info
        converters = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}
        if isinstance(input_type, str) and input_type in converters:
            try:
                value = converters[input_type](value)
                inputs[name] = value
            except Exception as ex:
                details = f"{name}, {value}, {ex}"
                extra_info = {
                    "input_name": name,
                    "input_config": info,
                    "received_value": value,
                    "exception_message": str(ex),
                }
                message = f"Failed to convert an input value to a {input_type} value"
                errors.append(_error("invalid_input_type", message, details, extra_info))
                return True
        bounds = {"input_name": name, "input_config": info, "received_value": value}
        if "min" in extra and value < extra["min"]:
            message = f"Value {value} smaller than min of {extra['min']}"
            errors.append(_error("value_smaller_than_min", message, name, bounds))
        elif "max" in extra and value > extra["max"]:
            message = f"Value {value} bigger than max of {extra['max']}"
            errors.append(_error("value_bigger_than_max", message, name, bounds))
        elif (combo := _combo_options(input_type, extra)) is not None and value not in combo:
            config: list[Any] | None = info
            if len(combo) > 20:
                listed, config = f"(list of length {len(combo)})", None
            else:
                listed = str(combo)
            errors.append(
                _error(
                    "value_not_in_list",
                    "Value not in list",
                    f"{name}: '{value}' not in {listed}",
                    {"input_name": name, "input_config": config, "received_value": value},
                )
            )
        return True

"""Workflows built for the frontend comparison: what ComfyUI's templates do not show.

Each is the SD1.5 text-to-image graph (checkpoint, two prompts, empty latent, KSampler, decode, save) written
the ways people save it: with Reroute nodes and native reroutes, a PrimitiveNode feeding a converted widget,
muted and bypassed nodes, and inside subgraphs, nested two deep, with mute and bypass inside and a widget
promoted to the subgraph instance; a muted and a bypassed subgraph instance; legacy group nodes, one with a
converted widget left open.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CKPT = "v1-5-pruned-emaonly-fp16.safetensors"


class Graph:
    """A small builder of UI-format graphs: ``node`` adds a node, ``link`` wires an output to an input."""

    def __init__(self, first_id: int = 1) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.links: list[dict[str, Any]] = []
        self.next_node = first_id

    def node(self, type_: str, inputs=(), outputs=(), values=None, mode: int = 0, title: str | None = None,
             node_id: int | None = None) -> int:
        node_id = node_id if node_id is not None else self.next_node
        self.next_node = max(self.next_node, node_id) + 1
        node: dict[str, Any] = {
            "id": node_id, "type": type_, "pos": [100 + 40 * len(self.nodes), 100], "size": [300, 100],
            "flags": {}, "order": len(self.nodes), "mode": mode,
            "inputs": [_input(spec) for spec in inputs],
            "outputs": [{"name": name, "type": kind, "links": []} for name, kind in outputs],
            "properties": {}, "widgets_values": list(values or [])}
        if title:
            node["title"] = title
        self.nodes.append(node)
        return node_id

    def find(self, node_id: int) -> dict[str, Any]:
        return next(node for node in self.nodes if node["id"] == node_id)

    def link(self, link_id: int, origin: int, origin_slot: int, target: int, target_slot: int) -> None:
        kind = self.out_type(origin, origin_slot) if origin >= 0 else "*"
        self.links.append({"id": link_id, "origin_id": origin, "origin_slot": origin_slot, "target_id": target,
                           "target_slot": target_slot, "type": kind})
        if origin >= 0:
            self.find(origin)["outputs"][origin_slot]["links"].append(link_id)
        if target >= 0:
            self.find(target)["inputs"][target_slot]["link"] = link_id

    def out_type(self, node_id: int, slot: int) -> str:
        return self.find(node_id)["outputs"][slot]["type"]

    def root(self, **extra: Any) -> dict[str, Any]:
        fields = ("id", "origin_id", "origin_slot", "target_id", "target_slot", "type")
        links = [[link[key] for key in fields] for link in self.links]
        return {"last_node_id": self.next_node, "last_link_id": max([link["id"] for link in self.links], default=0),
                "nodes": self.nodes, "links": links, "groups": [], "config": {}, "extra": extra, "version": 0.4}

    def subgraph(self, name: str, inputs: list[tuple[str, str]], outputs: list[tuple[str, str]]) -> dict[str, Any]:
        """A subgraph definition of these nodes; its inputs and outputs link through ids -10 and -20."""
        def ports(entries, side):
            return [{"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{side}/{n}")), "name": n, "type": t,
                     "linkIds": [link["id"] for link in self.links
                                 if (side == "in" and link["origin_id"] == -10 and link["origin_slot"] == i)
                                 or (side == "out" and link["target_id"] == -20 and link["target_slot"] == i)],
                     "pos": [0, 20 * i]} for i, (n, t) in enumerate(entries)]
        return {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)), "version": 1,
                "state": {"lastGroupId": 0, "lastNodeId": self.next_node, "lastLinkId": 900, "lastRerouteId": 0},
                "revision": 0, "config": {}, "name": name,
                "inputNode": {"id": -10, "bounding": [0, 0, 120, 100]},
                "outputNode": {"id": -20, "bounding": [900, 0, 120, 100]},
                "inputs": ports(inputs, "in"), "outputs": ports(outputs, "out"), "widgets": [],
                "nodes": self.nodes, "groups": [], "links": self.links, "extra": {}}


def _input(spec) -> dict[str, Any]:
    name, kind, *widget = spec
    entry = {"name": name, "type": kind, "link": None}
    if widget:
        entry["widget"] = {"name": name}
    return entry


def _sd15(g: Graph, seed_input: bool = False) -> dict[str, int]:
    """The text-to-image nodes, unlinked; returns their ids by role."""
    ksampler_inputs = [("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                       ("latent_image", "LATENT")]
    if seed_input:
        ksampler_inputs.append(("seed", "INT", "widget"))
    return {
        "ckpt": g.node("CheckpointLoaderSimple", outputs=[("MODEL", "MODEL"), ("CLIP", "CLIP"), ("VAE", "VAE")],
                       values=[CKPT], title="Load Checkpoint"),
        "pos": g.node("CLIPTextEncode", [("clip", "CLIP")], [("CONDITIONING", "CONDITIONING")],
                      ["a {red|blue} bottle // a comment"], title="Positive Prompt"),
        "neg": g.node("CLIPTextEncode", [("clip", "CLIP")], [("CONDITIONING", "CONDITIONING")], ["watermark"],
                      title="Negative Prompt"),
        "latent": g.node("EmptyLatentImage", outputs=[("LATENT", "LATENT")], values=[512, 512, 1]),
        "ks": g.node("KSampler", ksampler_inputs, [("LATENT", "LATENT")],
                     [42, "randomize", 20, 8, "euler", "normal", 1]),
        "dec": g.node("VAEDecode", [("samples", "LATENT"), ("vae", "VAE")], [("IMAGE", "IMAGE")]),
        "save": g.node("SaveImage", [("images", "IMAGE")], values=["ComfyUI"]),
    }


def reroutes_and_primitive() -> dict[str, Any]:
    """Reroute nodes on the CLIP and VAE wires, a PrimitiveNode feeding KSampler's converted seed, native reroutes."""
    g = Graph()
    n = _sd15(g, seed_input=True)
    r1 = g.node("Reroute", [("", "*")], [("", "CLIP")])
    r2 = g.node("Reroute", [("", "*")], [("", "CLIP")])
    prim = g.node("PrimitiveNode", outputs=[("INT", "INT")], values=[1234, "fixed"], title="Seed")
    g.find(prim)["outputs"][0]["widget"] = {"name": "seed"}
    for link in ((1, n["ckpt"], 0, n["ks"], 0), (2, n["ckpt"], 1, r1, 0), (3, r1, 0, r2, 0), (4, r2, 0, n["pos"], 0),
                 (5, r1, 0, n["neg"], 0), (6, n["pos"], 0, n["ks"], 1), (7, n["neg"], 0, n["ks"], 2),
                 (8, n["latent"], 0, n["ks"], 3), (9, n["ks"], 0, n["dec"], 0), (10, n["ckpt"], 2, n["dec"], 1),
                 (11, n["dec"], 0, n["save"], 0), (12, prim, 0, n["ks"], 4)):
        g.link(*link)
    return g.root(reroutes=[{"id": 1, "pos": [700, 500], "linkIds": [10]},
                            {"id": 2, "parentId": 1, "pos": [900, 500], "linkIds": [10]}],
                  linkExtensions=[{"id": 10, "parentId": 2}])


def mute_and_bypass() -> dict[str, Any]:
    """A bypassed LoraLoader between checkpoint and sampler and prompts, a muted preview, a muted decode branch."""
    g = Graph()
    n = _sd15(g)
    lora = g.node("LoraLoader", [("model", "MODEL"), ("clip", "CLIP")], [("MODEL", "MODEL"), ("CLIP", "CLIP")],
                  ["x.safetensors", 1, 1], mode=4)
    dec2 = g.node("VAEDecode", [("samples", "LATENT"), ("vae", "VAE")], [("IMAGE", "IMAGE")], mode=2)
    preview = g.node("PreviewImage", [("images", "IMAGE")])
    for link in ((1, n["ckpt"], 0, lora, 0), (2, n["ckpt"], 1, lora, 1), (3, lora, 0, n["ks"], 0),
                 (4, lora, 1, n["pos"], 0), (5, lora, 1, n["neg"], 0), (6, n["pos"], 0, n["ks"], 1),
                 (7, n["neg"], 0, n["ks"], 2), (8, n["latent"], 0, n["ks"], 3), (9, n["ks"], 0, n["dec"], 0),
                 (10, n["ckpt"], 2, n["dec"], 1), (11, n["dec"], 0, n["save"], 0), (12, n["ks"], 0, dec2, 0),
                 (13, n["ckpt"], 2, dec2, 1), (14, dec2, 0, preview, 0)):
        g.link(*link)
    return g.root()


def nested_subgraphs() -> dict[str, Any]:
    """Sampler subgraph (with a bypassed LoRA, a muted preview and a promoted seed) holding a Prompts subgraph."""
    prompts = Graph(first_id=100)
    pos = prompts.node("CLIPTextEncode", [("clip", "CLIP")], [("CONDITIONING", "CONDITIONING")], ["a cat"],
                       title="Positive Prompt")
    neg = prompts.node("CLIPTextEncode", [("clip", "CLIP")], [("CONDITIONING", "CONDITIONING")], ["blurry"],
                       title="Negative Prompt")
    for link in ((501, -10, 0, pos, 0), (502, -10, 0, neg, 0), (503, pos, 0, -20, 0), (504, neg, 0, -20, 1)):
        prompts.link(*link)
    prompts_def = prompts.subgraph("Prompts", [("clip", "CLIP")],
                                   [("positive", "CONDITIONING"), ("negative", "CONDITIONING")])

    sampler = Graph(first_id=200)
    inner = sampler.node(prompts_def["id"], [("clip", "CLIP")],
                         [("positive", "CONDITIONING"), ("negative", "CONDITIONING")], node_id=210)
    lora = sampler.node("LoraLoaderModelOnly", [("model", "MODEL")], [("MODEL", "MODEL")], ["x.safetensors", 1],
                        mode=4)
    ks = sampler.node("KSampler", [("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                                   ("latent_image", "LATENT"), ("seed", "INT", "widget")], [("LATENT", "LATENT")],
                      [5, "fixed", 12, 7, "euler", "karras", 1])
    muted = sampler.node("PreviewImage", [("images", "IMAGE")], mode=2)
    for link in ((601, -10, 0, lora, 0), (602, -10, 1, inner, 0), (603, lora, 0, ks, 0), (604, inner, 0, ks, 1),
                 (605, inner, 1, ks, 2), (606, -10, 2, ks, 3), (607, -10, 3, ks, 4), (608, ks, 0, -20, 0)):
        sampler.link(*link)
    del muted
    sampler_def = sampler.subgraph("Sampler", [("model", "MODEL"), ("clip", "CLIP"), ("latent_image", "LATENT"),
                                               ("seed", "INT")], [("LATENT", "LATENT")])

    g = Graph()
    ckpt = g.node("CheckpointLoaderSimple", outputs=[("MODEL", "MODEL"), ("CLIP", "CLIP"), ("VAE", "VAE")],
                  values=[CKPT])
    latent = g.node("EmptyLatentImage", outputs=[("LATENT", "LATENT")], values=[768, 512, 2])
    outer = g.node(sampler_def["id"], [("model", "MODEL"), ("clip", "CLIP"), ("latent_image", "LATENT")],
                   [("LATENT", "LATENT")], values=[777], node_id=57)
    dec = g.node("VAEDecode", [("samples", "LATENT"), ("vae", "VAE")], [("IMAGE", "IMAGE")])
    save = g.node("SaveImage", [("images", "IMAGE")], values=["nested"])
    for link in ((1, ckpt, 0, outer, 0), (2, ckpt, 1, outer, 1), (3, latent, 0, outer, 2), (4, outer, 0, dec, 0),
                 (5, ckpt, 2, dec, 1), (6, dec, 0, save, 0)):
        g.link(*link)
    workflow = g.root()
    workflow["definitions"] = {"subgraphs": [sampler_def, prompts_def]}
    return workflow


def bypassed_subgraph_node() -> dict[str, Any]:
    """The nested case with a muted save and the Prompts subgraph's negative encoder bypassed."""
    workflow = copy.deepcopy(nested_subgraphs())
    prompts = workflow["definitions"]["subgraphs"][1]
    prompts["nodes"][1]["mode"] = 4
    workflow["nodes"][-1]["mode"] = 2
    return workflow


def subgraph_instance_in_mode(mode: int) -> dict[str, Any]:
    """The nested case with the outer subgraph instance itself muted (2) or bypassed (4)."""
    workflow = copy.deepcopy(nested_subgraphs())
    next(node for node in workflow["nodes"] if node["id"] == 57)["mode"] = mode
    return workflow


def group_node() -> dict[str, Any]:
    """A legacy group node (``extra.groupNodes``) holding KSampler and VAEDecode, linked to the graph around it."""
    g = Graph()
    n = _sd15(g)
    group = {
        "nodes": [
            {**copy.deepcopy(g.find(n["ks"])), "index": 0},
            {**copy.deepcopy(g.find(n["dec"])), "index": 1},
        ],
        "links": [[0, 0, 1, 0, n["ks"], "LATENT"]],
        "external": [[1, 0, "IMAGE"]],
    }
    for inner in group["nodes"]:
        for entry in inner["inputs"]:
            entry["link"] = None
        for entry in inner["outputs"]:
            entry["links"] = []
    g.nodes = [node for node in g.nodes if node["id"] not in (n["ks"], n["dec"])]
    instance = g.node("workflow>Sampling", [("model", "MODEL"), ("positive", "CONDITIONING"),
                                            ("negative", "CONDITIONING"), ("latent_image", "LATENT"), ("vae", "VAE")],
                      [("IMAGE", "IMAGE")], [99, "fixed", 15, 6.5, "dpmpp_2m", "karras", 0.9], node_id=30)
    for link in ((1, n["ckpt"], 0, instance, 0), (2, n["ckpt"], 1, n["pos"], 0), (3, n["ckpt"], 1, n["neg"], 0),
                 (4, n["pos"], 0, instance, 1), (5, n["neg"], 0, instance, 2), (6, n["latent"], 0, instance, 3),
                 (7, n["ckpt"], 2, instance, 4), (8, instance, 0, n["save"], 0)):
        g.link(*link)
    return g.root(groupNodes={"Sampling": group})


def group_node_with_prompts() -> dict[str, Any]:
    """A group node of checkpoint, both prompts and a KSampler whose seed is a converted widget left open."""
    g = Graph()
    n = _sd15(g, seed_input=True)
    inner_ids = [n["ckpt"], n["pos"], n["neg"], n["ks"]]
    nodes = []
    for index, node_id in enumerate(inner_ids):
        inner = copy.deepcopy(g.find(node_id))
        for entry in inner["inputs"]:
            entry["link"] = None
        for entry in inner["outputs"]:
            entry["links"] = []
        nodes.append({**inner, "index": index})
    group = {"nodes": nodes,
             "links": [[0, 1, 1, 0, n["ckpt"], "CLIP"], [0, 1, 2, 0, n["ckpt"], "CLIP"],
                       [0, 0, 3, 0, n["ckpt"], "MODEL"], [1, 0, 3, 1, n["pos"], "CONDITIONING"],
                       [2, 0, 3, 2, n["neg"], "CONDITIONING"]],
             "external": [[0, 2, "VAE"], [3, 0, "LATENT"]]}
    g.nodes = [node for node in g.nodes if node["id"] not in inner_ids]
    instance = g.node("workflow>Prompted", [("latent_image", "LATENT"), ("seed", "INT")],
                      [("VAE", "VAE"), ("LATENT", "LATENT")],
                      [CKPT, "a {red|blue} fox", "ugly", 13, 7.5, "euler", "simple", 0.8, 31337, "fixed"],
                      node_id=40)
    for link in ((1, n["latent"], 0, instance, 0), (2, instance, 1, n["dec"], 0), (3, instance, 0, n["dec"], 1),
                 (4, n["dec"], 0, n["save"], 0)):
        g.link(*link)
    return g.root(groupNodes={"Prompted": group})


def subgraph_edges() -> dict[str, Any]:
    """One subgraph used twice, with a Reroute inside and an output fed by an inner node's input source, and two
    bypassed LoRA loaders in a row outside. Frontend 1.27.10's graphToPrompt throws for a PrimitiveNode inside
    a subgraph (a TypeError) and for a subgraph input wired straight to an output ("No output node found"), so
    neither has a reference to record."""
    inner = Graph(first_id=300)
    reroute = inner.node("Reroute", [("", "*")], [("", "MODEL")])
    ks = inner.node("KSampler", [("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                                 ("latent_image", "LATENT"), ("seed", "INT", "widget")], [("LATENT", "LATENT")],
                    [1, "fixed", 4, 3.5, "euler", "normal", 0.5])
    for link in ((701, -10, 0, reroute, 0), (702, reroute, 0, ks, 0), (703, -10, 1, ks, 1), (704, -10, 1, ks, 2),
                 (705, -10, 2, ks, 3), (707, ks, 0, -20, 0)):
        inner.link(*link)
    definition = inner.subgraph("Refine", [("model", "MODEL"), ("conditioning", "CONDITIONING"),
                                           ("latent", "LATENT")], [("LATENT", "LATENT")])

    g = Graph()
    n = _sd15(g)
    lora1 = g.node("LoraLoaderModelOnly", [("model", "MODEL")], [("MODEL", "MODEL")], ["a.safetensors", 1], mode=4)
    lora2 = g.node("LoraLoaderModelOnly", [("model", "MODEL")], [("MODEL", "MODEL")], ["b.safetensors", 1], mode=4)
    first = g.node(definition["id"], [("model", "MODEL"), ("conditioning", "CONDITIONING"), ("latent", "LATENT")],
                   [("LATENT", "LATENT")], node_id=80)
    second = g.node(definition["id"], [("model", "MODEL"), ("conditioning", "CONDITIONING"), ("latent", "LATENT")],
                    [("LATENT", "LATENT")], node_id=81)
    for link in ((1, n["ckpt"], 0, lora1, 0), (2, lora1, 0, lora2, 0), (3, lora2, 0, n["ks"], 0),
                 (4, n["ckpt"], 1, n["pos"], 0), (5, n["ckpt"], 1, n["neg"], 0), (6, n["pos"], 0, n["ks"], 1),
                 (7, n["neg"], 0, n["ks"], 2), (8, n["latent"], 0, n["ks"], 3), (9, lora2, 0, first, 0),
                 (10, n["pos"], 0, first, 1), (11, n["ks"], 0, first, 2), (12, n["ckpt"], 0, second, 0),
                 (13, n["neg"], 0, second, 1), (14, first, 0, second, 2), (15, second, 0, n["dec"], 0),
                 (16, n["ckpt"], 2, n["dec"], 1), (17, n["dec"], 0, n["save"], 0)):
        g.link(*link)
    workflow = g.root()
    workflow["definitions"] = {"subgraphs": [definition]}
    return workflow


def built(templates: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(case name, workflow) of every built case."""
    yield "built-reroutes-primitive", reroutes_and_primitive()
    yield "built-mute-bypass", mute_and_bypass()
    yield "built-nested-subgraphs", nested_subgraphs()
    yield "built-subgraph-mute-bypass", bypassed_subgraph_node()
    yield "built-subgraph-instance-muted", subgraph_instance_in_mode(2)
    yield "built-subgraph-instance-bypassed", subgraph_instance_in_mode(4)
    yield "built-group-node", group_node()
    yield "built-group-node-prompts", group_node_with_prompts()
    yield "built-subgraph-edges", subgraph_edges()

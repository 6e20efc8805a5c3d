"""A resource kind's commands from one declaration.

A module of :mod:`z9.client.commands` declares a :class:`KindSpec` — the kind's REST shape
(:class:`~z9.client.models.ResourceKind`: JSON key, path, answer model), its list columns and
detail fields, how a create and an update are asked for, and its actions — and
:meth:`KindSpec.register` builds ``z9 <plural> create|list|get|update|delete|restore`` and one
command per action, every mutation with ``--wait``/``--timeout`` and every command with ``-o
json``. The next kind is one more such module: its commands come with it.

Output, the same for every kind: ``-o json`` prints the API's own shapes — ``{"<name>": …,
"job": …}`` for a 202 (after ``--wait``: the resource as it then is and the finished job),
``{"<name>": …}`` for a get or an update, ``{"<plural>": […], "next_after": …}`` for a list.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..api import ApiError
from ..cli import FAILED, OK, USAGE, Ctx, mutation, table
from ..models import ResourceKind
from ._group import group, verb

Getter = Callable[[Any], Any]
Body = Callable[[argparse.Namespace], dict[str, Any]]


@dataclass(frozen=True)
class Arg:
    """One ``argparse`` argument: ``Arg("--name", required=True, help=…)``."""

    flags: tuple[str, ...]
    kw: dict[str, Any]

    def __init__(self, *flags: str, **kw: Any):
        object.__setattr__(self, "flags", flags)
        object.__setattr__(self, "kw", kw)

    def add(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(*self.flags, **self.kw)


@dataclass(frozen=True)
class DeleteOption:
    """A flag of another kind's ``z9 <plural> delete`` that becomes a query parameter of its
    ``DELETE`` (``param=true`` when given): declared by the kind that reacts to that deletion (the
    volume's ``--delete-volumes`` on ``z9 servers delete``), as the API declares it on that route."""

    plural: str
    flag: str
    param: str
    help: str


DELETE_OPTIONS: list[DeleteOption] = []


def delete_option(plural: str, flag: str, param: str, help: str) -> None:
    """Add a flag to ``z9 <plural> delete`` (see :class:`DeleteOption`)."""
    DELETE_OPTIONS.append(DeleteOption(plural, flag, param, help))


@dataclass(frozen=True)
class Action:
    """``z9 <plural> NAME ID [args…]`` → ``POST /<plural>/{id}/actions/<path>`` with ``body(args)``
    (202 and a job). ``aliases``: older command names that keep working."""

    name: str
    path: str
    help: str
    args: Sequence[Arg] = ()
    body: Body | None = None
    aliases: tuple[str, ...] = ()
    check: Callable[[argparse.Namespace], str | None] | None = None  # a usage error's message, or None


@dataclass(frozen=True)
class Update:
    """``z9 <plural> update ID [args…]`` → ``PATCH /<plural>/{id}`` with ``body(args)`` (no job);
    an empty body is a usage error naming ``args``."""

    args: Sequence[Arg]
    body: Body
    help: str


@dataclass
class KindSpec:
    kind: ResourceKind[Any]
    help: str
    statuses: Sequence[str]
    columns: Sequence[tuple[str, Getter]]  # the list table: (HEADER, getter)
    fields: Sequence[tuple[str, Getter]]   # the detail table: (label, getter); None values left out
    create_args: Sequence[Arg] = ()
    create_body: Body | None = None
    create_help: str = ""
    update: Update | None = None
    list_args: Sequence[Arg] = ()          # extra list filters: dest = the API's query parameter
    actions: Sequence[Action] = ()
    delete_help: str = ""
    restore_help: str = ""
    extra: Callable[[Any, argparse.ArgumentParser, argparse.ArgumentParser], None] | None = None
    id_help: str = ""
    _list_filters: list[str] = field(default_factory=list)

    # -------------------------------------------------------------- output

    def detail(self, item: Any) -> Any:
        return table(("field", "value"), [(label, v) for label, get in self.fields
                                          if (v := get(item)) is not None and v != ""])

    def rows(self, items: list[Any]) -> Any:
        return table([h for h, _ in self.columns], [[get(i) for _, get in self.columns] for i in items])

    # -------------------------------------------------------------- commands

    def _refetch(self, ctx: Ctx, rid: str) -> Any:
        return ctx.client.get(self.kind, rid)

    def _create(self, ctx: Ctx) -> int:
        assert self.create_body is not None
        accepted = ctx.client.create(self.kind, self.create_body(ctx.args))
        return mutation(ctx, accepted, self.detail, lambda: self._refetch(ctx, accepted.resource.id))

    def _list(self, ctx: Ctx) -> int:
        a = ctx.args
        filters = {k: getattr(a, k) for k in self._list_filters if getattr(a, k, None) is not None}
        # a name lookup finds what is there now: the deleted ones only when asked for
        common = dict(status=a.status, name=a.name, label_selector=a.selector,
                      include_deleted=True if a.include_deleted else (False if a.status is None else None), **filters)
        if a.all:
            items, next_after = list(ctx.client.iter(self.kind, **common)), None
        else:
            page = ctx.client.list(self.kind, limit=a.limit, after=a.after, **common)
            items, next_after = page.items, page.next_after
        ctx.emit({self.kind.key: items, "next_after": next_after}, lambda: self.rows(items))
        if next_after and not ctx.json:
            ctx.err.print(f"more: z9 {self.kind.plural} list --after {next_after} (or --all)", highlight=False)
        return OK

    def _get(self, ctx: Ctx) -> int:
        item = ctx.client.get(self.kind, ctx.args.id)
        ctx.emit({self.kind.name: item}, lambda: self.detail(item))
        return OK

    def _update(self, ctx: Ctx) -> int:
        assert self.update is not None
        body = self.update.body(ctx.args)
        if not body:
            flags = ", ".join(a.flags[0] for a in self.update.args if a.flags[0].startswith("--"))
            ctx.err.print(f"z9 {self.kind.plural} update: give at least one of {flags}", highlight=False)
            return USAGE
        item = ctx.client.update(self.kind, ctx.args.id, body)
        ctx.emit({self.kind.name: item}, lambda: self.detail(item))
        return OK

    def _action(self, action: Action) -> Callable[[Ctx], int]:
        def run(ctx: Ctx) -> int:
            if action.check is not None and (problem := action.check(ctx.args)):
                ctx.err.print(f"z9 {self.kind.plural} {action.name}: {problem}", highlight=False)
                return USAGE
            body = action.body(ctx.args) if action.body else None
            accepted = ctx.client.action(self.kind, ctx.args.id, action.path, body)
            return mutation(ctx, accepted, self.detail, lambda: self._refetch(ctx, ctx.args.id))
        return run

    def _plan(self, ctx: Ctx) -> int:
        """``z9 <plural> plan ID``: the drift and the steps; exit 0 in sync, 2 drift, 1 error (as
        ``terraform plan -detailed-exitcode``)."""
        try:
            plan = ctx.client.plan(self.kind, ctx.args.id)
        except ApiError as e:  # (a 409 too, and an API out of reach: an error is 1 here, not 3 or 4)
            ctx.refuse(e.code, f"refused ({e.status} {e.code}): {e.message}" if e.status else f"z9: {e.message}",
                       e.details)
            return FAILED
        ctx.emit(plan, lambda: plan_table(plan))
        if plan.waiting and not ctx.json:
            ctx.err.print(f"the job would first wait: {plan.waiting}", highlight=False, markup=False)
        for j in plan.blocked_by if not ctx.json else ():
            ctx.err.print(f"job {j.get('id')} ({j.get('kind')}, {j.get('status')}) of this {self.kind.label} comes "
                          "first: the plan is of the world as it is now", highlight=False, markup=False)
        return OK if plan.in_sync else DRIFT

    def _simple(self, call: Callable[[Any, str], Any]) -> Callable[[Ctx], int]:
        def run(ctx: Ctx) -> int:
            accepted = call(ctx.client, ctx.args.id)
            return mutation(ctx, accepted, self.detail, lambda: self._refetch(ctx, ctx.args.id))
        return run

    def register(self, sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
        k = self.kind
        id_help = self.id_help or f"the {k.label}'s id"
        verbs = group(sub, k.plural, self.help)
        if self.create_body is not None:
            p = verb(verbs, "create", self.create_help or f"create {_a(k.label)}", [common, waiting])
            for a in self.create_args:
                a.add(p)
            p.set_defaults(run=self._create)

        p = verb(verbs, "list", f"list {k.plural.replace('-', ' ')} (the deleted ones with --include-deleted or --status deleted)",
                 [common])
        p.add_argument("--status", choices=tuple(self.statuses))
        p.add_argument("--name", help=f"only the {k.label} of this name")
        p.add_argument("-l", "--selector", metavar="SELECTOR",
                       help="label selector: k=v, k!=v, k, !k, k in (a,b), comma-separated")
        p.add_argument("--include-deleted", action="store_true", help=f"the deleted {k.plural.replace('-', ' ')} too")
        p.add_argument("--limit", type=int, help="page size (1-500, default 100)")
        p.add_argument("--after", help="the next_after of the previous page")
        p.add_argument("--all", action="store_true", help="every page")
        for a in self.list_args:
            a.add(p)
            self._list_filters.append(a.kw.get("dest") or a.flags[0].lstrip("-").replace("-", "_"))
        p.set_defaults(run=self._list)

        p = verb(verbs, "get", f"show {_a(k.label)}", [common])
        p.add_argument("id", help=id_help)
        p.set_defaults(run=self._get)

        if self.update is not None:
            p = verb(verbs, "update", self.update.help, [common])
            p.add_argument("id", help=id_help)
            for a in self.update.args:
                a.add(p)
            p.set_defaults(run=self._update)

        p = verb(verbs, "delete", self.delete_help or (
            f"delete {_a(k.label)}: restorable until its deletion buffer ends" if k.buffered
            else f"delete {_a(k.label)} at once (no buffer, no restore)"), [common, waiting])
        p.add_argument("id", help=id_help)
        options = [o for o in DELETE_OPTIONS if o.plural == k.plural]
        for o in options:
            p.add_argument(o.flag, dest=f"delete_option_{o.param}", action="store_true", help=o.help)

        def delete(ctx: Ctx) -> int:
            params = {o.param: "true" for o in options if getattr(ctx.args, f"delete_option_{o.param}")}
            accepted = ctx.client.delete(k, ctx.args.id, params=params or None)
            return mutation(ctx, accepted, self.detail, lambda: self._refetch(ctx, ctx.args.id))
        p.set_defaults(run=delete)
        if k.buffered:
            p = verb(verbs, "restore", self.restore_help or f"cancel {_a(k.label)}'s deletion within its buffer",
                     [common, waiting])
            p.add_argument("id", help=id_help)
            p.set_defaults(run=self._simple(lambda c, i: c.restore(k, i)))

        from . import plannable

        if plannable(k.name):  # the API has a plan route only for a type that says which job converges it
            p = verb(verbs, "plan", f"what {_a(k.label)}'s job would change now: its drift and steps, each saying "
                     "whether it interrupts the guest (changes nothing; exit 0 in sync, 2 drift, 1 error)", [common])
            p.add_argument("id", help=id_help)
            p.set_defaults(run=self._plan)

        for action in self.actions:
            p = verbs.add_parser(action.name, help=action.help, description=action.help, parents=[common, waiting],
                                 aliases=list(action.aliases))
            p.add_argument("id", help=id_help)
            for a in action.args:
                a.add(p)
            p.set_defaults(run=self._action(action))
        if self.extra is not None:
            self.extra(verbs, common, waiting)
        return k.plural


DRIFT = 2  # z9 <plural> plan: the world differs from the intent (terraform plan -detailed-exitcode's 2)


def plan_table(plan: Any) -> Any:
    """A plan as people read it: in sync, or the drift then the steps."""
    if plan.in_sync:
        return table(("plan",), [[f"in sync ({plan.job_kind or 'nothing to converge'} would change nothing)"]])
    rows = [["waiting", plan.waiting, ""]] if plan.waiting else []
    rows += [[f"drift {d.path}", f"want {d.want!r}, have {d.have!r}", ""] for d in plan.drift]
    rows += [[f"step {i} {s.name}" + (f" ({s.member})" if s.member else ""), s.why,
              "DISRUPTIVE" if s.disruptive else "not interrupted"] for i, s in enumerate(plan.steps, 1)]
    return table(("what", "detail", "guest"), rows)


def _a(noun: str) -> str:
    """``noun`` with its article: "an address", "a server"."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


# ---------------------------------------------------------------------------------- shared argument types

def label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, not {text!r}")
    return key, value


LABEL_ARGS = (Arg("--label", action="append", type=label, metavar="KEY=VALUE",
                  help="repeatable; the given labels replace all of them"),
              Arg("--clear-labels", action="store_true", help="remove every label"))


def labels_of(a: argparse.Namespace) -> dict[str, str] | None:
    """The labels an update asks for (None: unchanged)."""
    if getattr(a, "label", None) is not None or getattr(a, "clear_labels", False):
        return dict(a.label or [])
    return None


def labels_text(labels: dict[str, str] | None) -> str | None:
    return ", ".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or None


def status_text(item: Any) -> str:
    return item.status + (f" ({item.status_reason})" if getattr(item, "status_reason", None) else "")


def given(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}

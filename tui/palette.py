"""The command palette's finder: any node, DAG or batch the TUI knows, by a fuzzy match of its id."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import Hit, Hits, Provider

from tui import fmt

if TYPE_CHECKING:
    from tui.app import BcTui


class FindProvider(Provider):
    def _targets(self) -> list[tuple[str, str, str]]:
        app = cast("BcTui", self.app)
        out = [("node", n, f"{r.info.state}, gen {r.info.generation}") for n, r in sorted(app.state.rows.items())]
        out += [("DAG", j.id, f"{j.template} {j.state}") for j in app.known_jobs.values()]
        out += [
            ("batch", b.id, f"{b.kind} on {len(b.leaves)} node(s), {b.approvals}/{b.threshold}")
            for b in app.known_batches.values()
        ]
        return out

    async def search(self, query: str) -> Hits:
        app = cast("BcTui", self.app)
        matcher = self.matcher(query)
        for what, ident, help_ in self._targets():
            # The palette reads markup in both texts: an id or a template is a node's or an operator's word.
            shown = fmt.markup(f"{what} {ident}")
            score = matcher.match(shown)
            if score > 0:
                yield Hit(score, matcher.highlight(shown), partial(app.goto, what, ident), help=fmt.markup(help_))

"""Session capabilities that change the session protocol itself (the Hello's `capabilities`, Welcome's back).

A node's Hello names what its agent can do; the gateway writes each as the node label `bc.dev/cap.<name>=1`
(`bc.gateway.hello.capability_labels`). Most say what a spec may hold (`devices.limits`, ...). The ones here
change what travels on the session stream, so the gateway answers them in `Welcome.capabilities`: an agent
takes the new frames only from a gateway that said it sends them, and keeps the older way with an older one.
"""

from __future__ import annotations

TUNNEL_OFFERS = "tunnel.offers"
"""The node's tunnel offers come on its session stream (`GatewayMessage.tunnel_offer`), not on a second
server call (`NodeTunnels.Listen`): one stream a node instead of two (docs/access.md, docs/scale.md). An agent
that does not name it, or a gateway that does not answer it, keeps `Listen`."""

"""The secret broker (docs/secrets.md): secrets kept sealed, scoped, and released to the nodes whose spec names them."""

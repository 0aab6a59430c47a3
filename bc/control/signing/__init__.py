"""What signs intent on the control plane (the Signer), and the check of what a node signed with its own key."""

"""Multi-hop persona queries over a people-directory lookup tool."""

"""Cheapest single supplier for an order, via find_suppliers and quote tools."""

"""Chained integer arithmetic with a calculator tool."""

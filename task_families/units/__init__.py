"""Unit-conversion and currency-exchange chains with convert and exchange tools."""

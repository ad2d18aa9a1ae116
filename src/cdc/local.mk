# src/cdc: sources and unit tests of this folder (included by the top Makefile.am)

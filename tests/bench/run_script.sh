#!/usr/bin/env bash
# Runs a bench script and prints its exit status last, so a CTest pass regular expression (which ignores the exit
# code) can require both the script's row and "exit status 0".
"$@"
echo "exit status $?"

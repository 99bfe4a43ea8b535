"""`python -m modeldrop` == the `modeldrop` console script."""

from modeldrop.cli import main

if __name__ == "__main__":
    main()

import sys

from tutorials.book.build import main

sys.exit(main())

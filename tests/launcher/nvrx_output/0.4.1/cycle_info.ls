total 8
drwxr-xr-x 2 root root 4096 Dec  1 09:42 .
drwxr-xr-x 3 root root 4096 Dec  1 09:42 ..

total 20
drwxr-xr-x 2 root root 4096 Dec  1 09:49 .
drwxr-xr-x 3 root root 4096 Dec  1 09:49 ..
-rw-r--r-- 1 root root  291 Dec  1 09:49 cycle_info.4242.0.0
-rw-r--r-- 1 root root  291 Dec  1 09:49 cycle_info.4242.0.1
-rw-r--r-- 1 root root  291 Dec  1 09:49 cycle_info.4242.0.2
lrwxrwxrwx 1 root root   19 Dec  1 09:49 cycle_info.4242.current -> cycle_info.4242.0.2

import time
x = 0
while True:
    for i in range(10**6):
        x += i * i

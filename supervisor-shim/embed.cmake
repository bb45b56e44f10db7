# Turns a text file into a C header holding its bytes:
#   cmake -DIN=guest/runtime.js -DOUT=runtime_js.h -DNAME=sb_shim_runtime_js -P embed.cmake
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hexlen)
math(EXPR len "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n    " body "${body}")
file(WRITE ${OUT}.tmp "/* generated from ${IN} by embed.cmake: DO NOT EDIT */\n"
     "static const unsigned char ${NAME}[${len}] = {\n    ${body}\n};\n")
file(RENAME ${OUT}.tmp ${OUT})

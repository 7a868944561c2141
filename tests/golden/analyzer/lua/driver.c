/* Runs a fixed Lua workload (recursion, closures, strings, tables, sorting, coroutines) so that a -pg
   build of Lua 5.4 produces a realistic profile. */
#include <stdio.h>
#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"
static const char *script =
"local function fib(n) if n < 2 then return n end return fib(n-1) + fib(n-2) end\n"
"local t = {}\n"
"for i = 1, 200000 do t[i] = string.format('%08d:%s', (i * 7919) % 100003, string.rep('x', i % 7)) end\n"
"table.sort(t)\n"
"local s = 0\n"
"for i = 1, #t, 3 do s = s + #t[i] + (tonumber(t[i]:sub(1, 8)) or 0) % 13 end\n"
"local co = coroutine.wrap(function() for i = 1, 20000 do coroutine.yield(i * 2) end end)\n"
"for i = 1, 20000 do s = s + co() end\n"
"local words = {}\n"
"for w in string.gmatch(string.rep('alpha beta gamma delta ', 100000), '%a+') do words[w] = (words[w] or 0) + 1 end\n"
"s = s + fib(29) + words.beta\n"
"local acc = {}\n"
"for i = 1, 200000 do acc[#acc + 1] = function() return i end end\n"
"for i = 1, #acc, 100 do s = s + acc[i]() end\n"
"print(s)\n";
int main(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  if (luaL_dostring(L, script) != LUA_OK) { fprintf(stderr, "%s\n", lua_tostring(L, -1)); return 1; }
  lua_close(L);
  return 0;
}

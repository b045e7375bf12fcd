import re,subprocess,sys
def loops(obj, fn):
    asm=subprocess.run(["aarch64-linux-gnu-objdump","-d","--no-show-raw-insn",obj],capture_output=True,text=True).stdout
    m=re.search(r"<%s>:\n(.*?)(?:\n\n|\Z)"%fn, asm, re.S)
    out=[]
    for line in m.group(1).splitlines():
        mm=re.match(r"\s*([0-9a-f]+):\s+(b\.\w+|b|cbn?z|tbn?z)\s.*?([0-9a-f]+) <",line)
        if mm:
            a=int(mm.group(1),16); t=int(mm.group(3),16)
            if t<a: out.append((a-t)//4+1)
    return out
arm=sys.argv[1]; gen=sys.argv[2]
for kind,suf in (("vec_dot","_f32"),("dequantize_row","_cpu"),("vec_mad","_cpu")):
    for b in (2,3,4):
        f=f"ggml_{kind}_turbo{b}_0{suf}"
        print(f, "neon loops", loops(arm,f), "generic loops", loops(gen,f+"_generic"))

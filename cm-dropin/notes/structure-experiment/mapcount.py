import sys,re,subprocess,json
def parse(text):
    text=re.sub(r'/\*.*?\*/','',text,flags=re.S)
    nodes={};order=[]
    for m in re.finditer(r'([A-Za-z0-9_@.]+)\s*\{(.*?)\}\s*([A-Za-z0-9_.]*)\s*;',text,flags=re.S):
        name,body=m.group(1),m.group(2)
        syms=[]
        sect=None
        for tok in re.split(r';',body):
            tok=tok.strip()
            if not tok: continue
            if tok.startswith('global:'): sect='g'; tok=tok[7:].strip()
            if tok.startswith('local:'): sect='l'; continue
            if tok and sect=='g': syms.append(tok)
        nodes[name]=syms;order.append(name)
    return order,nodes
repo='/work/.mirror/linux-rdma+rdma-core/repo'
tag,path=sys.argv[1],sys.argv[2]
t=subprocess.run(['git','-C',repo,'show',f'{tag}:{path}'],capture_output=True,text=True).stdout
o,n=parse(t)
if len(sys.argv)>3:
    print(json.dumps({k:n[k] for k in o}))
else:
    tot=0
    for k in o: print(f'{k}: {len(n[k])}'); tot+=len(n[k])
    allu=set(s for k in o for s in n[k])
    print('total entries',tot,'unique names',len(allu))

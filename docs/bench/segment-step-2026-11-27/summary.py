import json,glob,sys
d=sys.argv[1] if len(sys.argv)>1 else '/tmp/segab'
rows={}
for f in sorted(glob.glob(d+'/b*_*.json')):
    name=f.split('/')[-1][:-5]
    j=json.load(open(f))
    for r in j['runs']:
        key=(name.split('_')[0], r['model']['dir'].split('/')[-1], r['mode'])
        rows.setdefault(key,{}).setdefault(name.split('_')[1],[]).append(round(r['stats']['tokens_per_s'],1))
for k,v in sorted(rows.items()):
    b=v.get('base',[]); n=v.get('new',[])
    ratio = (sum(n)/len(n))/(sum(b)/len(b)) if b and n else None
    print(k, 'base',b,'new',n,'new/base', None if ratio is None else round(ratio,3))
